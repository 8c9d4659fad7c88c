"""``spectune bench``: benchmark spectune against plain decoding and transformers."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import shlex
from pathlib import Path
from typing import Any

from spectune.cli.common import (
    add_chat_template_arg,
    add_threads_arg,
    chat_template_from_args,
    set_threads,
)
from spectune.cli.common import parse_numbers as _numbers
from spectune.cli.paths import output_file, output_folder

__all__ = ["register"]


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


class _Preset(argparse.Action):
    """``--preset NAME``: set that preset's options here (flags after it still override)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any, *_: Any
    ) -> None:
        from spectune.bench.readme import preset

        for dest, setting in preset().items():
            setattr(namespace, dest, setting)
        namespace.preset = value


def register(subparsers: Any) -> None:
    from spectune.bench.names import SYSTEM_KEYS
    from spectune.cli.common import add_device_arg
    from spectune.models.names import TARGET_PRECISIONS

    parser = subparsers.add_parser(
        "bench",
        help="benchmark spectune against plain decoding and transformers",
        description="Runs every system on the same prompts in one process, interleaved, and "
        "writes results.json, results.md and PNG plots.",
    )
    parser.add_argument(
        "--preset",
        choices=("readme",),
        action=_Preset,
        default=None,
        help="readme: the README's results table, run end to end and written into README.md "
        "and docs/results/readme (what 'make results' runs; flags after it override)",
    )
    parser.add_argument("--target", default="default", help="target model (default: SmolLM2-135M)")
    parser.add_argument(
        "--draft",
        action="append",
        default=None,
        help="drafter (repeatable): a draft model path or shipped name, 'ngram', or 'random' "
        "(a useless random-weight draft), 'suffix[:INDEX]', 'hybrid' or 'suffix+DRAFT'. "
        "Default: every shipped draft, and ngram",
    )
    parser.add_argument("--prompts", type=Path, default=None, help="JSONL prompt file")
    parser.add_argument("--categories", default=None, help="comma-separated categories to keep")
    parser.add_argument(
        "--limit-per-category",
        type=int,
        default=None,
        help="prompts per category (default: every prompt of the split)",
    )
    parser.add_argument(
        "--split", default="test", help="prompt split: test (held out, default), dev, or all"
    )
    add_chat_template_arg(parser, "the prompts' chats (on a model without one they run plain)")
    parser.add_argument("--temperatures", default="0", help="comma-separated, e.g. 0,0.7")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per continuation")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each system on each prompt"
    )
    parser.add_argument(
        "--dtype",
        action="append",
        choices=TARGET_PRECISIONS,
        default=None,
        help="repeatable: fp32, bf16, int8, int4 (weight-only kernels on the CPU), or "
        "llamacpp (the GGUF on llama.cpp's kernels, with llama.cpp's own decoding as anchors; "
        "needs spectune[llamacpp]); a precision with '+compile' also runs torch.compile "
        "(default: fp32, the precision of the transformers anchors)",
    )
    add_device_arg(parser)
    parser.add_argument("--k", default="1,2,4,6,8", help="fixed Ks, comma-separated")
    parser.add_argument("--policies", default="threshold,cost", help="adaptive K policies")
    parser.add_argument(
        "--policy-file",
        action="append",
        default=[],
        help="also run the policy of this TOML file (e.g. spectune tune's output), named by "
        "its file name (repeatable)",
    )
    parser.add_argument(
        "--trees",
        default="",
        help="token-tree shapes WIDTHxNODES for each draft model, comma-separated (e.g. 2x16)",
    )
    parser.add_argument("--tree-k", default="4", help="tree depths K, comma-separated")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEM_KEYS),
        help="comma-separated: " + "; ".join(f"{k}: {v}" for k, v in SYSTEM_KEYS.items()),
    )
    parser.add_argument(
        "--prompt-lookup-tokens",
        type=int,
        default=10,
        help="draft length of transformers' own prompt lookup, the n-gram anchor",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="fit the run into this many minutes by dropping prompts and repeats, as the "
        "run's notes say (default: no limit)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled runs")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="folder for the results"
    )
    parser.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="also rewrite this file's results block and its plot (spectune.bench.readme)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a previous run's results.json: write comparison.md, this run's speedups beside "
        "its, each difference with its standard error (the readme preset: the committed run)",
    )
    add_threads_arg(parser)
    parser.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from spectune.bench.plan import BenchConfig
    from spectune.drafters.pairing import is_suffix_spec
    from spectune.models.devices import resolve_device
    from spectune.models.loading import resolve_model_path
    from spectune.models.shipped import shipped_drafts
    from spectune.records import validate_k

    drafters = tuple(args.draft) if args.draft else (*shipped_drafts(), "ngram")
    # Missing model files fail now, before minutes of loading.
    for ref in (args.target, *drafters):
        if ref not in ("ngram", "random") and not is_suffix_spec(ref):
            resolve_model_path(ref)
    return BenchConfig(
        target=args.target,
        drafters=drafters,
        temperatures=_numbers(args.temperatures, float, "--temperatures"),
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        dtypes=tuple(dict.fromkeys(args.dtype or ["fp32"])),
        device=resolve_device(args.device).type,
        ks=tuple(validate_k(k) for k in _numbers(args.k, int, "--k")),
        policies=_names(args.policies),
        policy_files=tuple(_checked_policy_files(args.policy_file)),
        trees=_names(args.trees),
        tree_ks=tuple(validate_k(k) for k in _numbers(args.tree_k, int, "--tree-k")),
        systems=_names(args.systems),
        seed=args.seed,
        prompt_lookup_tokens=args.prompt_lookup_tokens,
        budget_minutes=args.budget_minutes,
    )


def _checked_policy_files(paths: list[str]) -> list[str]:
    """Policy files that load and build (a bad one is a one-line error before loading)."""
    from spectune.control.config import load_policy_file
    from spectune.control.registry import build_policy

    for path in paths:
        build_policy(load_policy_file(path))
    return paths


def command_line(args: argparse.Namespace) -> str:
    """The run as one canonical command line, for the report (every option, explicit)."""
    parts = ["spectune", "bench", "--target", args.target]
    for draft in args.draft or []:
        parts += ["--draft", draft]
    if args.prompts is not None:
        parts += ["--prompts", str(args.prompts)]
    if args.chat_template is not None:
        parts += ["--chat-template", args.chat_template]
    parts += ["--device", args.device]
    for flag in ("categories", "limit_per_category", "budget_minutes", "threads"):
        value = getattr(args, flag)
        if value is not None:
            parts += ["--" + flag.replace("_", "-"), str(value)]
    for dtype in args.dtype or []:
        parts += ["--dtype", dtype]
    for path in args.policy_file:
        parts += ["--policy-file", path]
    if args.trees:
        parts += ["--trees", args.trees, "--tree-k", args.tree_k]
    for flag in ("split", "temperatures", "max_tokens", "repeats", "k", "policies", "systems"):
        parts += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    parts += ["--prompt-lookup-tokens", str(args.prompt_lookup_tokens), "--seed", str(args.seed)]
    if args.no_plots:
        parts.append("--no-plots")
    parts += ["--out", str(args.out)]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    import tempfile

    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from spectune.bench.assemble import load_workbench
    from spectune.bench.compare import load_baseline
    from spectune.bench.plan import load_bench_prompts
    from spectune.bench.suite import run_suite
    from spectune.prompts import load_prompts, prompt_encoding

    config = config_from_args(args)
    template = chat_template_from_args(args)
    categories = _names(args.categories) if args.categories else None
    split = None if args.split == "all" else args.split
    records = load_prompts(args.prompts, categories=categories, split=split)  # before loading
    if args.readme is not None:
        from spectune.bench.readme import results_block

        results_block(args.readme)  # a README without the block fails before the run
        output_file(args.readme, "--readme")
    # Read before the run: the baseline may be the results.json this run overwrites.
    baseline = None if args.baseline is None else load_baseline(args.baseline)
    output_folder(args.out, "--out")
    set_threads(args.threads)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    console = Console()
    workbenches = []
    prompts = None
    with tempfile.TemporaryDirectory(prefix="spectune-bench-") as scratch:
        for dtype in config.dtypes:
            console.print(f"loading {config.target} ({dtype}) and drafts {list(config.drafters)}")
            # transformers' GGUF conversion draws a plain tqdm bar on stderr; keep it out of
            # the report (errors still raise).
            with contextlib.redirect_stderr(io.StringIO()):
                workbench, loaded = load_workbench(config, dtype, Path(scratch) / dtype)
            workbenches.append(workbench)
            if prompts is None:
                encoding = prompt_encoding(loaded.tokenizer, template, records)
                prompts = load_bench_prompts(
                    encoding.tokenizer,
                    args.prompts,
                    categories=categories,
                    split=split,
                    limit_per_category=args.limit_per_category,
                )
                config = dataclasses.replace(config, prompt_format=encoding.format)
                if encoding.note is not None:
                    console.print(f"note: {encoding.note}")
                    workbench.notes.append(encoding.note)  # results.json's notes
        assert prompts is not None  # at least one dtype
        data = run_suite(
            config,
            workbenches,
            prompts,
            out=args.out,
            console=console,
            command=command_line(args),
            plots=not args.no_plots,
        )
    comparison = None
    if baseline is not None:
        from spectune.bench.compare import write_comparison

        comparison = write_comparison(baseline, data, args.out)
        console.print(f"against {args.baseline}: {comparison[1]} ({comparison[0]})")
    if args.readme is not None:
        from spectune.bench.readme import write_readme_results

        plot = write_readme_results(data, args.out, args.readme, comparison=comparison)
        console.print(f"rewrote the results block of {args.readme} and {plot}")
    return 0
