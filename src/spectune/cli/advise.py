"""``spectune advise``: measure the candidate drafts, predict, verify the best against plain
decoding, and write one report (table, ``advice.json``, a plot, the winner's policy file and
the export for the chosen engine)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.cli.common import (
    add_chat_template_arg,
    add_precision_args,
    add_runtime_arg,
    add_threads_arg,
    chat_template_from_args,
    precision_from_args,
    print_notes,
    set_threads,
)
from spectune.cli.paths import output_folder
from spectune.cli.select import check_candidate_paths
from spectune.control.config import PolicySpec
from spectune.engines.names import engine_arg
from spectune.engines.tuned import Tuning
from spectune.errors import InvalidParameterError, PromptError
from spectune.prompts import PromptEncoding, load_prompts, prompt_encoding

if TYPE_CHECKING:
    from spectune.advise.advisor import AdviseSettings
    from spectune.advise.engine import MeasuredOn
    from spectune.advise.schema import Advice

__all__ = ["register"]

DEFAULT_DRAFTS = ("smollm2-draft", "suffix")
ENGINES = ("spectune", "vllm", "sglang", "llamacpp")  # --engine: serve on spectune or export
# Flags whose default --quick changes (fewer prompts and tokens, one temperature, the top 2
# verified, no tuned policy): dest -> (default, with --quick). A flag given on the command
# line wins.
SCALED: dict[str, tuple[Any, Any]] = {
    "max_tokens": (48, 24),
    "temperatures": ("0,0.7", "0"),
    "top": (3, 2),
    "tune": (True, False),
}
# Prompts per category (full, --quick); with --traces, per trace file: the built-in set's
# totals (7 categories) for one file.
PER_CATEGORY = (4, 2)
TRACE_PROMPTS = (28, 14)


def _scaled_help(dest: str, text: str) -> str:
    full, quick = PER_CATEGORY if dest == "per_category" else SCALED[dest]
    return f"{text} (default: {full}; with --quick: {quick})"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "advise",
        help="measure candidate drafts, predict and verify their speedup, recommend one (or none)",
    )
    parser.add_argument(
        "--target",
        default="default",
        help="target model: 'default' (SmolLM2-135M-Instruct), a .gguf file or an HF folder",
    )
    parser.add_argument(
        "--draft",
        action="append",
        default=None,
        help="a candidate draft (repeat the flag): .gguf, HF folder, shipped draft name, "
        f"'ngram', 'suffix', 'hybrid' (default: {' '.join(DEFAULT_DRAFTS)})",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompts", default=None, help="prompt JSONL (default: the built-in set)")
    source.add_argument(
        "--traces",
        type=Path,
        default=None,
        help="replay recorded traffic instead: a step trace or a folder of them (serve/generate "
        "--trace), one category per file, at the temperatures it was served at",
    )
    parser.add_argument("--split", default="test", help="prompt split (dev, test, or 'all')")
    add_chat_template_arg(parser, "the prompts' chats (on a model without one they run plain)")
    parser.add_argument(
        "--limit-per-category",
        dest="per_category",
        type=int,
        default=None,
        help=_scaled_help("per_category", "prompts per category, half fit and half verify")
        + f"; with --traces, per trace file (default: {TRACE_PROMPTS[0]}; --quick: "
        f"{TRACE_PROMPTS[1]})",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=_scaled_help("max_tokens", "tokens per continuation and per verification run"),
    )
    parser.add_argument(
        "--temperatures",
        default=None,
        help=_scaled_help("temperatures", "comma-separated; the first decides K and the prediction")
        + "; with --traces, the traffic's, most frequent first (--quick: that one only)",
    )
    parser.add_argument(
        "--verify-prompts", type=int, default=7, help="held-apart prompts for the verification runs"
    )
    parser.add_argument(
        "--top", type=int, default=None, help=_scaled_help("top", "configurations verified")
    )
    parser.add_argument(
        "--max-k",
        type=int,
        default=8,
        help="largest K predicted, and the K the tuned policy's workload is recorded at",
    )
    parser.add_argument(
        "--tune",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=_scaled_help(
            "tune",
            "also fit a threshold policy for the best predicted drafter (spectune tune's "
            "search on the fitting half, recorded at --max-k) and verify it beside the fixed K",
        ),
    )
    parser.add_argument(
        "--engine",
        type=engine_arg(ENGINES),
        metavar="{" + ",".join(ENGINES) + "}",
        default="spectune",
        help="the engine the winner is for (llamacpp may also be spelled llama.cpp)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer prompts and tokens, temperature 0 only, the top 2 verified, no tuned policy",
    )
    parser.add_argument(
        "--trust-draft-vocab",
        action="store_true",
        help="pair drafts that ship no tokenizer without comparing token strings",
    )
    add_threads_arg(parser)
    parser.add_argument("--out", type=Path, default=Path("advise-report"), help="report folder")
    add_precision_args(parser)
    add_runtime_arg(parser)
    parser.set_defaults(run=run)


def _settings(
    args: argparse.Namespace, traffic_temperatures: tuple[float, ...] = ()
) -> AdviseSettings:
    """The settings, ``--quick`` applied where a flag was left at its default; recorded
    traffic's temperatures where it gives them and no --temperatures was given."""
    from spectune.advise.advisor import AdviseSettings

    if args.temperatures is None and traffic_temperatures:
        chosen = traffic_temperatures[:1] if args.quick else traffic_temperatures
        args.temperatures = ",".join(f"{t:g}" for t in chosen)
    for dest, (full, quick) in SCALED.items():
        if getattr(args, dest) is None:
            setattr(args, dest, quick if args.quick else full)
    try:
        temperatures = tuple(float(t) for t in args.temperatures.split(","))
    except ValueError:
        raise InvalidParameterError(
            f"--temperatures {args.temperatures!r}: give comma-separated numbers, e.g. 0,0.7"
        ) from None
    if any(t < 0 for t in temperatures):
        raise InvalidParameterError("--temperatures must be >= 0")
    precision, device = precision_from_args(args)
    return AdviseSettings(
        temperatures=temperatures,
        max_tokens=args.max_tokens,
        verify_prompts=args.verify_prompts,
        top=args.top,
        max_k=args.max_k,
        precision=precision,
        device=device,
        runtime=args.runtime,
        trust_draft_vocab=args.trust_draft_vocab,
        tune_policy=args.tune,
    )


def _per_category(args: argparse.Namespace) -> int:
    if args.per_category is None:
        full, quick = TRACE_PROMPTS if args.traces is not None else PER_CATEGORY
        args.per_category = quick if args.quick else full
    if args.per_category < 1:
        raise InvalidParameterError("--limit-per-category must be at least 1")
    return int(args.per_category)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from spectune.advise.advisor import advise
    from spectune.advise.engine import measured_on, stated
    from spectune.advise.on_vllm import draft_refusal, vllm_target
    from spectune.advise.traffic import load_traffic
    from spectune.control.crossover import curve_for_this_machine
    from spectune.drafters.pairing import load_target
    from spectune.engines.export import refusal_of_draft

    # Every setting is checked before minutes of loading.
    output_folder(args.out, "--out")
    if args.traces is not None and args.chat_template is not None:
        raise InvalidParameterError("--chat-template applies to --prompts, not to --traces")
    per_category = _per_category(args)
    measured = measured_on(args.engine, args.target, args.runtime)
    args.runtime = measured.runtime  # llama.cpp's kernels for --engine llamacpp, where they run
    on_vllm = measured.verdict_on == "vllm"  # --engine vllm, installed: vLLM runs the pick
    if on_vllm:
        vllm_target(args.target)  # a target vLLM cannot be given: one line, before loading
    traffic = None if args.traces is None else load_traffic(args.traces, per_category)
    settings = _settings(args, () if traffic is None else traffic.temperatures)
    specs = list(args.draft or DEFAULT_DRAFTS)
    check_candidate_paths(specs)
    template = chat_template_from_args(args)
    notes: list[str] = []
    if args.engine != "spectune":
        refusal = draft_refusal if on_vllm else partial(refusal_of_draft, engine=args.engine)
        specs = _exportable(specs, args, notes, refusal)
    set_threads(args.threads)
    chosen = []
    if traffic is None:
        split = None if args.split == "all" else args.split
        chosen = load_prompts(args.prompts, split=split, limit_per_category=per_category)
        if not chosen:
            raise PromptError(f"no prompts to measure on in {args.prompts or 'the built-in set'}")
    target = load_target(
        args.target,
        dtype=settings.precision.dtype,
        quantize=settings.precision.quantize,
        device=settings.device,
        runtime=args.runtime,
    )
    encoding: PromptEncoding | None = None  # recorded traffic is token ids already
    if traffic is not None:
        traffic.check(target.model.info.name, target.model.info.vocab_size)
        prompts = traffic.prompts
        notes.extend(traffic.notes)
    else:
        encoding = prompt_encoding(target.tokenizer, template, chosen)
        prompts = [(p.id, p.category, p.tokens(encoding.tokenizer)) for p in chosen]
    curve_for_this_machine(target.model, report=notes.append)  # a hybrid prices trees with it
    print_notes(notes)
    console = Console() if sys.stdout.isatty() else Console(width=140)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        tasks: dict[str, Any] = {}

        def on_progress(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = progress.add_task(step, total=total)
            progress.update(tasks[step], completed=done)

        advice = advise(target, args.target, specs, prompts, settings, on_progress=on_progress)
    if encoding is not None:
        advice = _with_prompt_format(advice, encoding)
    if on_vllm:
        advice, measured = _on_vllm(advice, prompts, settings, args, console)
    _write(stated(advice, measured, args.target), args, console)
    return 0


def _on_vllm(
    advice: Advice,
    prompts: list[tuple[str, str, list[int]]],
    settings: AdviseSettings,
    args: argparse.Namespace,
    console: Any,
) -> tuple[Advice, MeasuredOn]:
    """vLLM runs the configuration the screening picked (``spectune.advise.on_vllm``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from spectune.advise.engine import measured_on
    from spectune.advise.on_vllm import check_on_vllm, held_and_warmup, with_check

    held, warmup = held_and_warmup(prompts, settings.verify_prompts)
    args.out.mkdir(parents=True, exist_ok=True)  # an EAGLE-3 head is written there
    started = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,  # the check's figures are printed with the tables
    ) as progress:
        task = progress.add_task("vLLM", total=None)

        def on_step(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total)

        check = check_on_vllm(
            advice,
            args.target,
            held,
            warmup,
            max_tokens=settings.max_tokens,
            quick=args.quick,
            out=args.out,
            runtime=args.runtime,
            on_step=on_step,
            say=console.print,
        )
    seconds = advice.seconds + time.perf_counter() - started  # the run's wall, vLLM's too
    advice = dataclasses.replace(advice, seconds=seconds)
    return with_check(advice, check, measured_on("vllm", args.target, args.runtime))


def _with_prompt_format(advice: Advice, encoding: PromptEncoding) -> Advice:
    """The prompt format in the record's settings; a model without a chat template, whose
    chats ran as plain prompts, in its notes too."""
    notes = advice.notes if encoding.note is None else (encoding.note, *advice.notes)
    settings = {**advice.settings, "prompt_format": encoding.format}
    return dataclasses.replace(advice, settings=settings, notes=notes)


def _exportable(
    specs: list[str],
    args: argparse.Namespace,
    notes: list[str],
    refusal: Callable[[str], str | None],
) -> list[str]:
    """The candidates the export's engine can load (``refusal``: why it cannot load a
    draft): a draft it cannot is an error when given with --draft, left out with a note
    when a default; the target must be one it loads."""
    from spectune.engines.export import target_refusal

    engine = args.engine
    target = target_refusal(args.target, engine)
    if target is not None:
        raise InvalidParameterError(f"--engine {args.engine}: {target}")
    refused = {spec: refusal(spec) for spec in specs}
    reasons = [reason for reason in refused.values() if reason is not None]
    if reasons and args.draft is not None:
        raise InvalidParameterError(f"--engine {args.engine}: {reasons[0]}")
    if len(reasons) == len(specs):
        raise InvalidParameterError(
            f"--engine {args.engine} loads none of the default drafts: " + "; ".join(reasons)
        )
    notes.extend(f"{spec} left out: {reason}" for spec, reason in refused.items() if reason)
    return [spec for spec, reason in refused.items() if reason is None]


def _write(advice: Advice, args: argparse.Namespace, console: Any) -> None:
    from spectune.advise.on_vllm import export_command
    from spectune.advise.report import (
        checklist_table,
        config_table,
        engine_table,
        plot,
        position_table,
    )
    from spectune.control.tune import policy_toml
    from spectune.engines.export import export

    args.out.mkdir(parents=True, exist_ok=True)
    outputs = advice.outputs
    verdict = advice.verdict
    if verdict.speculate and verdict.winner:
        best = next(
            r.prediction for r in advice.configurations if r.prediction.label == verdict.winner
        )
        policy = args.out / "policy.toml"
        spec = best.policy or PolicySpec("fixed", {"k": best.k})
        policy.write_text(policy_toml(spec, (f"spectune advise: {verdict.summary}",)))
        outputs["policy"] = policy.name
        engine = args.engine
        measured_command = export_command(advice)
        if measured_command is not None:  # the very config vLLM measured, on its folder
            command = measured_command
        elif engine == "spectune":
            command = (
                f"spectune serve --target {args.target} --draft {best.drafter} "
                f"--policy-file {policy}"
            )
        else:
            plan = export(Tuning(best.drafter, best.k, target=args.target, source="advise"), engine)
            notes = list(plan.notes)
            if best.policy is not None:
                notes.append(
                    f"{engine} takes a fixed K: the tuned policy's starting K ({best.k}); the "
                    "policy itself adapts K only in spectune (policy.toml)"
                )
            command = "\n".join([plan.command, *(f"# {n}" for n in notes)])
        path = args.out / f"export-{args.engine}.txt"
        path.write_text(command + "\n")
        outputs["export"] = path.name
    png = args.out / "advice.png"
    plot(advice, png)
    outputs["plot"] = png.name
    outputs["json"] = "advice.json"
    advice.write(args.out / "advice.json")
    console.print(position_table(advice))
    console.print(config_table(advice))
    engines = engine_table(advice)
    if engines is not None:
        console.print(engines)
    if advice.checklist:
        console.print(checklist_table(advice))
    for note in advice.notes:
        console.print(f"  note: {note}")
    console.print(f"[bold]Verdict:[/bold] {verdict.summary}")
    for reason in verdict.reasons:
        console.print(f"  - {reason}")
    written = "  ".join(f"{role}: {name}" for role, name in outputs.items())
    console.print(f"in {args.out}: {written}  ({advice.seconds:.0f} s)")
