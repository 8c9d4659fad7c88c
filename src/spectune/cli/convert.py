"""``spectune convert``: write a target as a Hugging Face folder that vLLM serves.

The target (``default``, a ``.gguf`` file or a native model folder) is read as spectune's
own runtime reads it, fp32, and written with its tokenizer and chat template
(``spectune.engines.hf_folder``). The folder is then checked: transformers loads it and
its logits must equal spectune's own on a few prompts (the same top token everywhere,
differences within the stated tolerance). Converting the same source into the same folder
again is instant.

With ``--draft``, it writes a feature head (``spectune distill --kind feature --layout
eagle3``) as vLLM's EAGLE-3 draft folder for the target folder given as ``--target``
(``spectune.engines.vllm.eagle3``): serve it with ``--speculative-config
'{"method": "eagle3", "model": OUT, "num_speculative_tokens": K}'``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from spectune.errors import InvalidParameterError, ModelLoadError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="write a target (GGUF or native) as a Hugging Face folder vLLM serves",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--target",
        default=None,
        help="'default', a .gguf file or a model folder (default: 'default'); with --draft, "
        "the target's Hugging Face folder that vLLM serves",
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument(
        "--draft",
        help="write this feature-head draft (a folder or shipped name) as vLLM's EAGLE-3 "
        "folder instead of converting a target",
    )
    parser.add_argument(
        "--k", type=int, default=3, help="with --draft: the folder's default draft tokens"
    )
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip comparing the folder's logits with spectune's runtime",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spectune.engines.hf_folder import check_logits, check_source, convert_target, record_check

    if args.draft is not None:
        return _run_draft(args)
    args.target = args.target or "default"
    check_source(args.target, args.out)  # bad input: one line, before any loading
    conversion = convert_target(args.target, args.out)
    verb = "up to date" if conversion.reused else "wrote"
    print(f"{verb}: {conversion.folder} (from {conversion.source})")
    print(f"source sha256 {conversion.sha256}")
    if not args.check:
        return 0
    if conversion.check is not None and conversion.check.passed:
        print(f"checked when written: {conversion.check.summary()}")
        return 0
    check = check_logits(args.target, conversion.folder)
    if not check.passed:
        raise ModelLoadError(f"the converted folder does not match: {check.summary()}")
    record_check(conversion.folder, check)
    print(f"checked: {check.summary()}")
    return 0


def _run_draft(args: argparse.Namespace) -> int:
    from spectune.engines.vllm.eagle3 import export_eagle3

    if args.target is None:
        raise InvalidParameterError(
            "--draft needs --target: the Hugging Face folder vLLM serves ('spectune convert' "
            "writes one)"
        )
    done = export_eagle3(args.draft, Path(args.target), args.out, k=args.k)
    print(
        f"wrote: {done.folder} (vLLM EAGLE-3, draft vocabulary {done.draft_vocab_size}, "
        f"target layers {list(done.aux_layer_ids)} in vLLM's numbering)"
    )
    print("--speculative-config '" + json.dumps(done.speculative_config(args.k)) + "'")
    return 0
