"""Arguments and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spectune.control.config import PolicySpec
from spectune.errors import InvalidParameterError
from spectune.models.chat_templates import BUILTIN_TEMPLATES, ChatTemplate, resolve_chat_template
from spectune.models.facts import RUNTIMES, model_facts
from spectune.models.machine import usable_cores
from spectune.models.names import DEVICES, LLAMACPP, PRECISION_NAMES
from spectune.models.refs import DEFAULT_TARGET

if TYPE_CHECKING:
    import torch

    from spectune.drafters.base import Drafter
    from spectune.drafters.pairing import Loaded
    from spectune.models.quant import Precision
    from spectune.sampling import SamplingParams

__all__ = [
    "DTYPE_HELP",
    "add_chat_template_arg",
    "add_device_arg",
    "add_model_args",
    "add_precision_args",
    "add_runtime_arg",
    "add_sampling_args",
    "auto_precision",
    "chat_template_from_args",
    "load_models",
    "parse_numbers",
    "parse_precision",
    "precision_from_args",
    "print_notes",
    "print_warning",
    "sampling_from_args",
    "startup_line",
]

_ALIASES = {"float32": "fp32", "bfloat16": "bf16"}
AUTO = "auto"
DTYPE_HELP = (
    "weights' precision: auto (default: int4 for a Llama-family GGUF stored in Q4_0/Q4_1, "
    "such as the default target, on the CPU; else fp32), fp32, bf16, or int8 / int4 "
    "weight-only quantisation on PyTorch's CPU kernels (rest of the model in fp32; a "
    "Q4_0/Q4_1 GGUF maps onto int4 as stored)"
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
        help="drafter: a draft model (.gguf, HF folder, shipped draft name), 'ngram', "
        "'suffix[:INDEX]' (suffix drafting; docs/suffix.md), 'hybrid' or 'suffix+DRAFT', "
        "or 'none'. Default: suffix for the default target, else ngram",
    )
    add_runtime_arg(parser)
    add_precision_args(parser)
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


def add_runtime_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        default="auto",
        choices=RUNTIMES,
        help="auto (native for Llama-family models, else transformers), native, hf "
        "(transformers), or llamacpp (a .gguf on llama.cpp's kernels: pip install "
        "'spectune[llamacpp]'; no token trees, no feature-head drafts)",
    )


def add_precision_args(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` (the precision) and ``--device``; read them with ``precision_from_args``."""
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=sorted({AUTO, *PRECISION_NAMES, *_ALIASES}),
        help=DTYPE_HELP,
    )
    add_device_arg(parser)


def add_compile_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compile",
        action="store_true",
        help="run the target's forwards after the prompt compiled by torch.compile (native "
        "runtime; chain drafts only, no token trees; each chunk size compiles at its first "
        "use: about 20 s for one token, minutes for a chunk of 9 on a small CPU)",
    )


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    """``--threads``, the same flag in every subcommand that runs a model on the CPU."""
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch and llama.cpp, fixed (default: OMP_NUM_THREADS where "
        "set, else the cores that other processes leave idle, followed while decoding)",
    )


def add_chat_template_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """``--chat-template FILE|NAME``; read it with ``chat_template_from_args``."""
    parser.add_argument(
        "--chat-template",
        metavar="FILE|NAME",
        default=None,
        help=f"the chat template for {what}: a Jinja file, or one of "
        f"{', '.join(sorted(BUILTIN_TEMPLATES))} (plain: the messages' text as it stands). "
        "Default: the model's own",
    )


def chat_template_from_args(args: argparse.Namespace) -> ChatTemplate | None:
    """``--chat-template`` as a checked template (None: the model's own); a missing or broken
    file is a one-line error here, before any model loads."""
    value = getattr(args, "chat_template", None)
    return None if value is None else resolve_chat_template(value)


def set_threads(threads: int | None, *, reserve: int = 0) -> None:
    """``--threads`` as a fixed CPU thread count; without it, ``OMP_NUM_THREADS`` where the
    user set it (torch already follows it), else the count follows the idle cores
    (``spectune.models.threads``), keeping ``reserve`` of them for the process's other
    threads (the server's request handling), at least one for compute."""
    from spectune.models.threads import adapt_threads, fix_threads

    if threads is None:
        if not os.environ.get("OMP_NUM_THREADS"):
            adapt_threads(max(1, usable_cores() - reserve))
        return
    if threads < 1:
        raise InvalidParameterError(f"--threads must be >= 1, got {threads}")
    fix_threads(threads)


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        choices=DEVICES,
        help="where models run: auto (default: cuda when torch sees a GPU and the dtype is "
        "not int8/int4, else cpu), cpu or cuda",
    )


def precision_from_args(args: argparse.Namespace) -> tuple[Precision, torch.device]:
    """``--dtype`` and ``--device`` as the target loads with them (``auto`` resolved:
    ``auto_precision``)."""
    from spectune.models.devices import resolve_device

    runtime = getattr(args, "runtime", None)
    if args.dtype == AUTO:
        device = resolve_device(args.device, cpu_kernels=runtime == LLAMACPP)
        precision = auto_precision(getattr(args, "target", DEFAULT_TARGET), runtime, device)
        return precision, device
    precision = parse_precision(args.dtype)
    # llama.cpp offloads to a GPU only when asked (--device cuda): its build may have none.
    cpu_kernels = precision.quantize != "none" or runtime == LLAMACPP
    return precision, resolve_device(args.device, cpu_kernels=cpu_kernels)


def auto_precision(target: str, runtime: str | None, device: torch.device) -> Precision:
    """What ``--dtype auto`` runs ``target`` at: int4 for a Llama-family GGUF stored in
    Q4_0/Q4_1 on the native runtime and the CPU (its layers go to the int4 kernel as
    stored: plain decoding 3.35x fp32's speed on two cores, docs/usage.md "Runtimes", and greedy
    speculative output equal to plain int4 decoding's); else fp32."""
    from spectune.models.loading import stored_in_4_bits
    from spectune.models.quant import PRECISIONS

    native = runtime in (None, "auto", "native")
    if native and device.type == "cpu" and stored_in_4_bits(target):
        return PRECISIONS["int4"]
    return PRECISIONS["fp32"]


def default_drafter(target: Loaded) -> str:
    """The drafter when ``--draft`` is not given: the suffix drafter over the shipped index
    where that index serves the target's vocabulary (the default target's; the fastest
    measured drafter on it on fp32 and int4, docs/history.md), else n-gram (it needs
    nothing built for the target)."""
    from spectune.drafters.pairing import shipped_suffix_serves

    return "suffix" if shipped_suffix_serves(target) else "ngram"


def load_models(args: argparse.Namespace, notes: list[str]) -> tuple[Loaded, Drafter | None]:
    """The target and the drafter that ``add_model_args`` describe (``default_drafter``),
    at the ``--dtype`` precision on ``--device``; where it drafts, with the target's
    verification-cost curve recorded for this machine (measured first if none is: a line
    saying so lands in ``notes``, for the caller to print once its input is checked, so a
    bad input still gets its one error line). What the models' metadata decides (the
    runtime, the precision, a draft model's pairing) is checked before either loads."""
    from spectune.control.crossover import curve_for_this_machine
    from spectune.drafters.pairing import (
        check_draft_before_loading,
        compile_target,
        load_drafter,
        load_target,
    )

    precision, device = precision_from_args(args)
    check_draft_before_loading(
        args.draft,
        model_facts(args.target, args.runtime),
        runtime=args.runtime,
        quantize=precision.quantize,
    )
    target = load_target(
        args.target,
        dtype=precision.dtype,
        runtime=args.runtime,
        allow_missing_weights=args.allow_missing_weights,
        quantize=precision.quantize,
        device=device,
    )
    if getattr(args, "compile", False):  # before the drafter: pairing reads tree_masks
        compile_target(target.model, on_compile=_compiling)
    spec = args.draft or default_drafter(target)
    if spec != "none":  # the cost policy and a hybrid price verification with it
        curve_for_this_machine(target.model, report=notes.append)
    drafter = load_drafter(
        spec,
        target,
        dtype=precision.dtype,
        runtime=args.runtime,
        allow_missing_weights=args.allow_missing_weights,
        trust_draft_vocab=args.trust_draft_vocab,
        quantize=precision.quantize,
        device=device,
    )
    return target, drafter


def _compiling(tokens: int) -> None:
    """A progress line: a compile takes seconds to minutes, with nothing else to show."""
    print(
        f"spectune: compiling the target's forward over {tokens} token(s), once for this "
        "size (about 20 s for one token, minutes for 9 on a small CPU)",
        file=sys.stderr,
        flush=True,
    )


def startup_line(drafter: Drafter | None, spec: PolicySpec) -> str:
    """Which drafter is really active and under which K policy, in one line."""
    from spectune.drafters.pairing import drafter_summary

    options = ", ".join(f"{key}={value}" for key, value in sorted(spec.options.items()))
    policy = f"policy {spec.name}" + (f" ({options})" if options else "")
    if drafter is None:
        policy = "no speculation"
    return f"drafter {drafter_summary(drafter)}; {policy}"


def print_notes(notes: list[str]) -> None:
    """``load_models``' notes, one ``spectune: note:`` line each on stderr."""
    for note in notes:
        print(f"spectune: note: {note}", file=sys.stderr, flush=True)


def print_warning(message: str) -> None:
    """One warning line on stderr, as the CLI prints them."""
    print(f"spectune: warning: {message}", file=sys.stderr, flush=True)


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy"
    )
    parser.add_argument(
        "--top-k", type=int, default=0, help="sample among the K most likely tokens; 0 = all"
    )
    parser.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling mass; 1.0 = all tokens"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the request's random stream, for repeatable sampling (default: a fresh "
        "seed from the OS)",
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def parse_precision(name: str) -> Precision:
    from spectune.models.quant import PRECISIONS

    try:
        return PRECISIONS[_ALIASES.get(name, name)]
    except KeyError as exc:
        raise InvalidParameterError(f"unknown dtype {name!r} ({', '.join(PRECISIONS)})") from exc


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    from spectune.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )


def parse_numbers(text: str, kind: type[int] | type[float], what: str) -> tuple[Any, ...]:
    """``"0,0.7"`` -> (0.0, 0.7); a one-line error naming ``what`` otherwise."""
    try:
        values = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise InvalidParameterError(
            f"{what}: expected comma-separated numbers, got {text!r}"
        ) from exc
    if not values:
        raise InvalidParameterError(f"{what}: empty list")
    return values


def round_robin(prompts: Sequence[Any], count: int) -> list[Any]:
    """``count`` prompts taken in turn from each category, in file order."""
    by_category: dict[str, list[Any]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    picked: list[Any] = []
    while len(picked) < min(count, len(prompts)):
        for queue in by_category.values():
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked
