"""Arguments and helpers shared by the subcommands."""

from __future__ import annotations

import argparse

import torch

from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams

__all__ = ["add_model_args", "add_sampling_args", "parse_dtype", "sampling_from_args"]

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default="default",
        help="target model: 'default' (SmolLM2-135M-Instruct), a .gguf file or an HF folder",
    )
    parser.add_argument(
        "--draft",
        default=None,
        help="drafter: a draft model (.gguf, HF folder, shipped draft name), 'ngram', "
        "'suffix[:INDEX]' (suffix drafting; docs/suffix.md), 'hybrid' or 'suffix+DRAFT', "
        "or 'none'",
    )
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--runtime", default="auto", choices=("auto", "native", "hf"))


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError as exc:
        raise InvalidParameterError(f"unknown dtype {name!r}") from exc


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )
