"""``spectune export --to vllm|sglang|llamacpp``: a tuned setup as another engine's flags."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from spectune.errors import InvalidParameterError
from spectune.export import ENGINES, Tuning, export, read_tuning

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="turn a select/bench result into vLLM, SGLang or llama.cpp speculative-decoding flags",
        description="Reads a 'spectune select' JSON (recommendation.draft, recommendation.k) "
        "or a 'spectune bench' results.json (best spectune row by speedup); explicit "
        "options override what the file says.",
    )
    parser.add_argument("result", nargs="?", type=Path, help="select or bench result JSON")
    parser.add_argument("--to", required=True, choices=ENGINES, help="the engine to export to")
    parser.add_argument("--target", help="the target model path or hub id for the command")
    parser.add_argument("--draft", help="draft model path or hub id, or 'ngram'")
    parser.add_argument("--k", type=int, help="draft tokens per step")
    parser.add_argument(
        "--speculate-max-batch", type=int, help="no speculation above this many running requests"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.result is not None:
        tuning = read_tuning(args.result)
    elif args.draft is not None and args.k is not None:
        tuning = Tuning(draft=args.draft, k=args.k)
    else:
        raise InvalidParameterError("give a result file, or both --draft and --k")
    overrides = {
        "draft": args.draft,
        "k": args.k,
        "speculate_max_batch": args.speculate_max_batch,
        "target": args.target,
    }
    tuning = replace(tuning, **{k: v for k, v in overrides.items() if v is not None})
    plan = export(tuning, args.to)
    if args.json:
        print(json.dumps(plan.as_json(), indent=2))
        return 0
    print(plan.command)
    for note in plan.notes:
        print(f"# note: {note}")
    return 0
