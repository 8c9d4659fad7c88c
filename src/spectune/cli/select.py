"""``spectune select``: rank candidate drafts for a target and recommend one (with K)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

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
from spectune.errors import InvalidParameterError
from spectune.prompts import load_prompts, prompt_encoding

__all__ = ["check_candidate_paths", "register"]


def check_candidate_paths(specs: list[str]) -> None:
    """A candidate that names a file that is not there is a typo: fail before any loading.
    ``ngram``, ``suffix[:INDEX]`` and ``hybrid`` name no model file."""
    from spectune.drafters.pairing import is_suffix_spec
    from spectune.models.loading import resolve_model_path

    for spec in specs:
        if spec != "ngram" and not is_suffix_spec(spec):
            resolve_model_path(spec)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "select",
        help="rank candidate drafts for a target: compatibility, size, acceptance, cost, speedup",
    )
    parser.add_argument(
        "--target",
        default="default",
        help="target model: 'default' (SmolLM2-135M-Instruct), a .gguf file or an HF folder",
    )
    parser.add_argument(
        "candidates",
        nargs="+",
        help="draft candidates: .gguf files, HF folders, distilled draft folders, shipped "
        "draft names, 'ngram', 'suffix[:INDEX]', 'hybrid'",
    )
    parser.add_argument("--prompts", default=None, help="prompt JSONL (default: the built-in set)")
    parser.add_argument("--split", default="test", help="prompt split (dev, test, or 'all')")
    add_chat_template_arg(parser, "the prompts' chats (on a model without one they run plain)")
    parser.add_argument(
        "--limit-per-category",
        "--per-category",
        dest="per_category",
        type=int,
        default=4,
        help="prompts per category",
    )
    parser.add_argument(
        "--continuation-tokens",
        type=int,
        default=48,
        help="tokens of the target's own continuation each candidate is scored on",
    )
    parser.add_argument(
        "--confirm-prompts",
        type=int,
        default=6,
        help="prompts of the short confirmation run of each candidate at its K",
    )
    parser.add_argument(
        "--confirm-tokens", type=int, default=48, help="tokens per confirmation run"
    )
    parser.add_argument("--max-k", type=int, default=8, help="largest K predicted")
    parser.add_argument(
        "--extra-k",
        type=int,
        action="append",
        default=[],
        help="also measure this K for the predicted-vs-measured plot",
    )
    parser.add_argument("--no-confirm", action="store_true", help="skip the real runs")
    add_threads_arg(parser)
    parser.add_argument(
        "--trust-draft-vocab",
        action="store_true",
        help="rank drafts that ship no tokenizer without comparing their token strings",
    )
    parser.add_argument(
        "--out",
        "--report-dir",
        dest="report_dir",
        type=Path,
        default=Path("select-report"),
        help="folder for the report",
    )
    add_precision_args(parser)
    add_runtime_arg(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from spectune.control.crossover import curve_for_this_machine
    from spectune.drafters.pairing import load_target
    from spectune.select.report import render_notes, render_table, write_report
    from spectune.select.selector import SelectSettings, select

    if args.per_category < 1:
        raise InvalidParameterError("--per-category must be at least 1")
    # Settings are checked before minutes of loading.
    output_folder(args.report_dir, "--out")
    precision, device = precision_from_args(args)
    settings = SelectSettings(
        continuation_tokens=args.continuation_tokens,
        confirm_prompts=args.confirm_prompts,
        confirm_tokens=args.confirm_tokens,
        max_k=args.max_k,
        extra_ks=tuple(args.extra_k),
        confirm=not args.no_confirm,
        precision=precision,
        device=device,
        runtime=args.runtime,
        trust_draft_vocab=args.trust_draft_vocab,
    )
    check_candidate_paths(args.candidates)
    template = chat_template_from_args(args)
    chosen = load_prompts(  # a bad file fails before the target loads
        args.prompts,
        split=None if args.split == "all" else args.split,
        limit_per_category=args.per_category,
    )
    set_threads(args.threads)
    target = load_target(
        args.target,
        dtype=precision.dtype,
        quantize=precision.quantize,
        device=device,
        runtime=args.runtime,
    )
    encoding = prompt_encoding(target.tokenizer, template, chosen)
    prompts = [(p.id, p.category, p.tokens(encoding.tokenizer)) for p in chosen]
    settings = dataclasses.replace(settings, prompt_format=encoding.format)
    # Before the candidates load: a hybrid prices its merged trees with this machine's curve.
    notes: list[str] = [] if encoding.note is None else [encoding.note]
    curve_for_this_machine(target.model, report=notes.append)
    print_notes(notes)
    # Piped output gets rich's 80 columns, too narrow for the table: widen it there.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        tasks: dict[str, Any] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total)
            progress.update(tasks[stage], completed=done)

        report = select(
            target, args.target, args.candidates, prompts, settings, on_progress=on_progress
        )
    console.print(render_table(report))
    for note in render_notes(report):
        console.print(f"  note: {note}")
    rec = report.recommendation
    console.print(f"[bold]Recommendation:[/bold] {rec.draft} with K={rec.k}")
    for reason in rec.reasons:
        console.print(f"  - {reason}")
    paths = write_report(report, args.report_dir)
    console.print(f"report: {paths['markdown']}  json: {paths['json']}  ({report.seconds:.0f} s)")
    return 0
