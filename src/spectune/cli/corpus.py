"""``spectune corpus``: build (or resume) the target-generated answer corpus, or count it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from spectune.cli.common import add_device_arg, add_threads_arg, set_threads
from spectune.cli.paths import output_folder
from spectune.distill.settings import PROMPT_MIXES, CorpusSettings
from spectune.errors import InvalidParameterError

__all__ = ["register"]


def _shard_range(text: str) -> range:
    """``start:stop`` or ``start:stop:step`` (several processes take every step-th shard)."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (2, 3) or parts[0] < 0 or parts[1] <= parts[0] or parts[-1] < 1:
        raise argparse.ArgumentTypeError(
            f"expected start:stop[:step] with start < stop, got {text!r}"
        )
    return range(*parts)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "corpus",
        help="build the target's own answers to model-written prompts (distillation corpus)",
        description="The instruct target writes user turns and documents for every task of the "
        "prompt set plus code, then answers them (greedy and T=0.7) on the batched runtime. "
        "Shards are resumable: a killed run continues at the first missing shard.",
    )
    parser.add_argument("--target", default="default", help="target model (default, .gguf, folder)")
    parser.add_argument("--out", type=Path, required=True, help="corpus folder (shards)")
    parser.add_argument(
        "--seeds",
        action="append",
        type=Path,
        default=[],
        help="GSM8K / Alpaca-style JSONL seed files (math questions, instructions); repeatable",
    )
    parser.add_argument(
        "--shards", type=_shard_range, default=range(1), help="start:stop[:step] (default 0:1)"
    )
    parser.add_argument(
        "--items-per-shard",
        type=int,
        default=CorpusSettings.items_per_shard,
        help="prompts (and answers) per shard",
    )
    parser.add_argument(
        "--max-answer-tokens",
        type=int,
        default=CorpusSettings.max_answer_tokens,
        help="longest answer the target writes",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=CorpusSettings.max_batch,
        help="requests the target decodes together",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and sampling")
    parser.add_argument(
        "--prompt-mix",
        type=int,
        choices=PROMPT_MIXES,
        default=CorpusSettings.prompt_mix,
        help="which prompts (spectune.distill.corpus): 1 = the committed shards 0-56 and 58, "
        "2 = adds closed-book questions and translations into English (default)",
    )
    add_threads_arg(parser)
    parser.add_argument("--stats", action="store_true", help="only count what --out holds")
    add_device_arg(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spectune.distill.corpus import SeedData, build_shards, corpus_stats
    from spectune.drafters.pairing import load_target
    from spectune.models.devices import resolve_device

    if args.stats:
        print(json.dumps(corpus_stats(args.out), indent=2))
        return 0
    for flag, value in (
        ("--items-per-shard", args.items_per_shard),
        ("--max-answer-tokens", args.max_answer_tokens),
        ("--batch", args.batch),
    ):
        if value < 1:
            raise InvalidParameterError(f"{flag} must be >= 1, got {value}")
    set_threads(args.threads)
    output_folder(args.out, "--out", [("--seeds", path) for path in args.seeds])
    seeds = SeedData.read(args.seeds)  # checked before the target loads
    target = load_target(args.target, device=resolve_device(args.device))
    settings = CorpusSettings(
        items_per_shard=args.items_per_shard,
        max_answer_tokens=args.max_answer_tokens,
        max_batch=args.batch,
        seed=args.seed,
        prompt_mix=args.prompt_mix,
    )
    start = time.perf_counter()
    positions = 0

    def on_shard(index: int, answers: list[Any]) -> None:
        nonlocal positions
        positions += sum(len(a.answer) for a in answers)
        rate = positions / (time.perf_counter() - start)
        print(
            f"shard {index}: {len(answers)} answers, {positions:,} answer positions this run "
            f"({rate:.0f}/s)",
            flush=True,
        )

    build_shards(
        target.model,
        target.tokenizer,
        seeds,
        args.out,
        args.shards,
        settings,
        on_shard=on_shard,
    )
    return 0
