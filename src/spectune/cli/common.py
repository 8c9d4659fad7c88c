"""Arguments and helpers shared by the subcommands."""

from __future__ import annotations

import argparse

import torch

from spectune.devices import DEVICES, resolve_device
from spectune.drafters.base import Drafter
from spectune.errors import InvalidParameterError
from spectune.models.quant import PRECISIONS, Precision
from spectune.pairing import Loaded
from spectune.sampling import SamplingParams

__all__ = [
    "DTYPE_HELP",
    "add_device_arg",
    "add_model_args",
    "add_precision_args",
    "load_from_args",
    "add_sampling_args",
    "parse_precision",
    "precision_from_args",
    "sampling_from_args",
]

_ALIASES = {"float32": "fp32", "bfloat16": "bf16"}
DTYPE_HELP = (
    "weights' precision: fp32, bf16, or int8 / int4 weight-only quantisation on PyTorch's "
    "CPU kernels (rest of the model in fp32; a Q4_0/Q4_1 GGUF maps onto int4 as stored)"
)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default="default",
        help="target model: 'default' (SmolLM2-135M-Instruct), a .gguf file or an HF folder",
    )
    parser.add_argument(
        "--draft",
        default=None,
        help="drafter: a draft model (.gguf, HF folder, shipped draft name), 'ngram' or 'none'",
    )
    parser.add_argument("--runtime", default="auto", choices=("auto", "native", "hf"))
    add_precision_args(parser)


def add_precision_args(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` (the precision) and ``--device``; read them with ``precision_from_args``."""
    parser.add_argument(
        "--dtype", default="fp32", choices=sorted({*PRECISIONS, *_ALIASES}), help=DTYPE_HELP
    )
    add_device_arg(parser)


def load_from_args(args: argparse.Namespace) -> tuple[Loaded, Drafter | None]:
    """The target and drafter that ``--target``, ``--draft`` (default ``ngram``),
    ``--dtype``, ``--runtime`` and ``--device`` name (``add_model_args``)."""
    from spectune.pairing import load_drafter, load_target

    precision, device = precision_from_args(args)
    options = {
        "dtype": precision.dtype,
        "runtime": args.runtime,
        "quantize": precision.quantize,
        "device": device,
    }
    target = load_target(args.target, **options)
    return target, load_drafter(args.draft or "ngram", target, **options)


def precision_from_args(args: argparse.Namespace) -> tuple[Precision, torch.device]:
    precision = parse_precision(args.dtype)
    return precision, resolve_device(args.device, cpu_kernels=precision.quantize != "none")


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        choices=DEVICES,
        help="where models run: auto (default: cuda when torch sees a GPU and the dtype is "
        "not int8/int4, else cpu), cpu or cuda",
    )


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def parse_precision(name: str) -> Precision:
    try:
        return PRECISIONS[_ALIASES.get(name, name)]
    except KeyError as exc:
        raise InvalidParameterError(f"unknown dtype {name!r} ({', '.join(PRECISIONS)})") from exc


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )
