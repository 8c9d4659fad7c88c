"""``spectune suffix-index``: build a suffix-drafting index from the target's own answers.

The source is a corpus folder written by the distillation corpus builder (its answers are
read with ``spectune.distill.corpus.read_answers``) or a JSON-lines file with one token
list per line (``[1, 2, 3]`` or ``{"tokens": [...]}``). Only the answers are indexed
(what the target said, which is what drafts guess). The index records the target's
vocabulary size and tokenizer fingerprint; ``--draft suffix:PATH`` rejects it for a
target with another vocabulary.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spectune.cli.paths import output_file
from spectune.distill.sources import read_json_lines
from spectune.drafters.names import DEFAULT_MAX_DEPTH
from spectune.errors import InvalidParameterError, ModelLoadError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "suffix-index",
        help="build a suffix-drafting index (--draft suffix:PATH) from a corpus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", type=Path, help="corpus folder of answers, or a .jsonl file")
    parser.add_argument(
        "--out", "--output", "-o", dest="output", type=Path, required=True, help="index file (.npz)"
    )
    parser.add_argument("--target", default="default", help="the model the corpus is from")
    parser.add_argument(
        "--split",
        default="train",
        choices=("train", "heldout", "all"),
        help="corpus split to index",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="stop adding answers past this many tokens"
    )
    parser.add_argument(
        "--max-depth",
        type=int,
        default=DEFAULT_MAX_DEPTH,
        help="longest context tail the index matches, in tokens",
    )
    parser.set_defaults(run=run)


def _jsonl_tokens(path: Path) -> Iterator[list[int]]:
    for number, item in read_json_lines(path):
        tokens = item.get("tokens") if isinstance(item, dict) else item
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise InvalidParameterError(f"{path}:{number}: expected a list of token ids")
        yield tokens


def _answers(folder: Path, split: str) -> Iterator[list[int]]:
    from spectune.distill.corpus import read_answers

    for answer in read_answers(folder, split=None if split == "all" else split):
        yield list(answer.answer)


def run(args: argparse.Namespace) -> int:
    from spectune.drafters.pairing import load_target
    from spectune.drafters.suffix_index import SuffixIndex, tokenizer_fingerprint

    source: Path = args.source
    for flag, value in (("--max-tokens", args.max_tokens), ("--max-depth", args.max_depth)):
        if value is not None and value < 1:
            raise InvalidParameterError(f"{flag} must be >= 1, got {value}")
    output_file(args.output, "--out", [("corpus", source)], make_parents=True)
    if source.is_dir():
        documents = _answers(source, args.split)
    elif source.is_file():
        documents = _jsonl_tokens(source)
    else:
        raise ModelLoadError(f"no corpus at {source}")
    kept: list[list[int]] = []
    total = 0
    for doc in documents:
        if args.max_tokens is not None and total + len(doc) > args.max_tokens:
            break
        kept.append(doc)
        total += len(doc)
    if not kept:
        raise InvalidParameterError(f"{source}: no answers to index")
    target = load_target(args.target, runtime="native")
    started = time.perf_counter()
    index = SuffixIndex.build(
        kept,
        vocab_size=target.model.info.vocab_size,
        tokenizer=tokenizer_fingerprint(target.tokenizer.token_strings()),
        target=target.model.info.name,
        source=f"{source.name} ({args.split})",
        max_depth=args.max_depth,
    )
    seconds = time.perf_counter() - started
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        index.save(args.output)
    except OSError as exc:
        raise InvalidParameterError(f"cannot write {args.output}: {exc.strerror or exc}") from exc
    size = args.output.stat().st_size
    print(
        f"indexed {len(kept)} answers, {total} tokens in {seconds:.2f} s -> {args.output} "
        f"({size / 2**20:.2f} MiB on disk, {index.nbytes / 2**20:.1f} MiB in memory)"
    )
    return 0
