"""``spectune export --to vllm|sglang|llamacpp``: a tuned setup as another engine's flags, or a
one-line refusal (exit status 2) when the engine cannot load its draft or target."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from spectune.engines.names import ENGINES, engine_arg
from spectune.engines.tuned import Tuning, read_tunings
from spectune.errors import InvalidParameterError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="turn a select/bench result into vLLM, SGLang or llama.cpp speculative-decoding flags",
        description="Reads a 'spectune select' JSON (recommendation.draft, recommendation.k) "
        "or a 'spectune bench' results.json (the best spectune row by speedup whose draft the "
        "engine can load, with a note for better ones it cannot); explicit options override "
        "what the file says. A draft or target the engine cannot load is refused in one line.",
    )
    parser.add_argument("result", nargs="?", type=Path, help="select or bench result JSON")
    parser.add_argument(
        "--to",
        required=True,
        type=engine_arg(),
        metavar="{" + ",".join(ENGINES) + "}",
        help="the engine to export to (llamacpp may also be spelled llama.cpp)",
    )
    parser.add_argument(
        "--target", help="the target: a path, hub id or 'default' (llama.cpp: a .gguf)"
    )
    parser.add_argument(
        "--draft",
        help="a draft model folder, GGUF file, shipped draft name or hub id, or 'ngram', 'suffix'",
    )
    parser.add_argument("--k", type=int, help="draft tokens per step")
    parser.add_argument(
        "--speculate-max-batch", type=int, help="no speculation above this many running requests"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spectune.engines.drafts import DRAFT_TEMPLATE
    from spectune.engines.export import export_best

    if args.result is not None:
        tunings = read_tunings(args.result)
    elif args.draft is not None and args.k is not None:
        tunings = [Tuning(draft=args.draft, k=args.k)]
    else:
        raise InvalidParameterError("give a result file, or both --draft and --k")
    if args.draft == DRAFT_TEMPLATE:
        raise InvalidParameterError(
            f"--draft {DRAFT_TEMPLATE} is a placeholder: give the draft's folder, file or hub id"
        )
    overrides = {
        "draft": args.draft,
        "k": args.k,
        "speculate_max_batch": args.speculate_max_batch,
        "target": args.target,
    }
    tunings = [replace(t, **{k: v for k, v in overrides.items() if v is not None}) for t in tunings]
    if args.draft is not None:
        tunings = tunings[:1]  # the file's ranking is of its own drafts
    plan = export_best(tunings, args.to)
    if args.json:
        print(json.dumps(plan.as_json(), indent=2))
        return 0
    print(plan.command)
    for note in plan.notes:
        print(f"# note: {note}")
    return 0
