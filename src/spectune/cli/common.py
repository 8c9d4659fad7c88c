"""Arguments and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys

import torch

from spectune.control.config import PolicySpec
from spectune.drafters.base import Drafter
from spectune.errors import InvalidParameterError
from spectune.pairing import Loaded, drafter_summary, load_drafter, load_target
from spectune.sampling import SamplingParams

__all__ = [
    "add_model_args",
    "add_sampling_args",
    "load_models",
    "parse_dtype",
    "print_warning",
    "sampling_from_args",
    "startup_line",
]

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
    parser.add_argument(
        "--allow-missing-weights",
        action="store_true",
        help="load a model whose files lack weights it expects or hold tensors it does not "
        "use (warns; missing weights stay random). Default: refuse",
    )
    parser.add_argument(
        "--trust-draft-vocab",
        action="store_true",
        help="pair a draft that ships no tokenizer without comparing its token strings "
        "with the target's (warns). Default: refuse",
    )


def load_models(args: argparse.Namespace) -> tuple[Loaded, Drafter | None]:
    """The target and the drafter that ``add_model_args`` describe (default drafter: ngram)."""
    dtype = parse_dtype(args.dtype)
    target = load_target(
        args.target,
        dtype=dtype,
        runtime=args.runtime,
        allow_missing_weights=args.allow_missing_weights,
    )
    drafter = load_drafter(
        args.draft or "ngram",
        target,
        dtype=dtype,
        runtime=args.runtime,
        allow_missing_weights=args.allow_missing_weights,
        trust_draft_vocab=args.trust_draft_vocab,
    )
    return target, drafter


def startup_line(drafter: Drafter | None, spec: PolicySpec) -> str:
    """Which drafter is really active and under which K policy, in one line."""
    options = ", ".join(f"{key}={value}" for key, value in sorted(spec.options.items()))
    policy = f"policy {spec.name}" + (f" ({options})" if options else "")
    if drafter is None:
        policy = "no speculation"
    return f"drafter {drafter_summary(drafter)}; {policy}"


def print_warning(message: str) -> None:
    """One warning line on stderr, as the CLI prints them."""
    print(f"spectune: warning: {message}", file=sys.stderr, flush=True)


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
