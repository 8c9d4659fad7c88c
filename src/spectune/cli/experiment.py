"""``spectune experiment tree|batch|chunked|runtimes|history|evidence``: the measurements
behind the README figures (``evidence``: ``spectune.cli.evidence``).

``--toy`` runs the same code on the toy models in seconds (to check a command works);
real runs use the default target, a draft (``--draft``: path, shipped name, or a
stand-in ``noise:X`` / ``layers:N``), and the evaluation prompts' dev split,
``--per-category`` prompts of each category.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.cli.common import add_threads_arg, set_threads
from spectune.cli.evidence import add_arguments as add_evidence_arguments
from spectune.cli.evidence import run as run_evidence
from spectune.cli.paths import output_file
from spectune.errors import InvalidParameterError
from spectune.models.names import LLAMACPP, TARGET_PRECISIONS

if TYPE_CHECKING:
    from spectune.experiments.common import Setup

__all__ = ["register"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("values must be >= 1")
    return values


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "experiment",
        help="measure trees vs chains, batching, chunked verification, runtimes; "
        "evidence: the practice rules, measured, in one report",
    )
    parser.add_argument(
        "which",
        choices=("tree", "batch", "chunked", "runtimes", "history", "evidence"),
        help="the experiment; the option groups below name the ones each option applies to",
    )
    parser.add_argument("--toy", action="store_true", help="toy models: seconds, for checks")
    parser.add_argument(
        "--target",
        default="default",
        help="target model: 'default' (SmolLM2-135M-Instruct), a .gguf file or an HF folder",
    )
    parser.add_argument(
        "--draft",
        default="auto",
        help="draft model path or shipped name (auto: the shipped draft), or a stand-in: "
        "noise:X (the target plus noise) or layers:N (its first N layers)",
    )
    parser.add_argument(
        "--limit-per-category",
        "--per-category",
        dest="per_category",
        type=int,
        default=1,
        help="prompts per category",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="tokens per continuation (default: 64 for tree, else 32)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    add_threads_arg(parser)
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=TARGET_PRECISIONS,
        help="the target's runtime (tree, batch, chunked, history): fp32, bf16, int8 / int4 "
        "weight-only kernels, or llamacpp (the GGUF on llama.cpp's kernels)",
    )
    tree = parser.add_argument_group("tree")
    tree.add_argument("--budgets", type=_ints, default=(4, 8), help="node budgets (= chain K)")
    tree.add_argument("--widths", type=_ints, default=(2,), help="tree widths to compare")
    tree.add_argument(
        "--min-path-prob",
        type=float,
        default=0.0,
        help="expand only nodes whose cumulative draft probability reaches this",
    )
    tree.add_argument("--temperatures", type=_floats, default=(0.0, 0.7), help="comma-separated")
    batch = parser.add_argument_group("batch")
    batch.add_argument(
        "--sizes", type=_ints, default=(1, 2, 4, 8, 16), help="batch sizes, comma-separated"
    )
    batch.add_argument(
        "-k", "--k", type=_ints, default=(1, 4), help="draft tokens per step to try (batch)"
    )
    batch.add_argument("--no-save", action="store_true", help="do not record the crossover")
    batch.add_argument(
        "--repeats", type=int, default=3, help="rounds per batch size; the median run counts"
    )
    chunked = parser.add_argument_group("chunked")
    chunked.add_argument("--ks", type=_ints, default=(4, 8), help="chain lengths K to verify")
    chunked.add_argument(
        "--groups",
        type=_ints,
        default=(2,),
        help="groups a chain is verified in (beside one pass), comma-separated",
    )
    chunked.add_argument("--temperature", type=float, default=0.0, help="(chunked, history)")
    runtimes = parser.add_argument_group("runtimes")
    runtimes.add_argument(
        "--precisions",
        default="fp32,bf16,int8,int4",
        help="comma-separated fp32, bf16, int8, int4 or llamacpp (the GGUF on llama.cpp's "
        "kernels), a precision with '+compile' (its one-token steps compiled, "
        "LlamaLM.compile_steps); the first is the reference (runtimes; test prompts)",
    )
    history = parser.add_argument_group("history (suffix drafting across requests)")
    history.add_argument("--requests", type=int, default=100, help="requests served in turn")
    history.add_argument("--window", type=int, default=50, help="requests per reported window")
    history.add_argument(
        "--history-tokens", type=int, default=262_144, help="history budget (0: no history)"
    )
    add_evidence_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spectune.experiments.common import load_setup, toy_setup

    if args.per_category < 1:
        raise InvalidParameterError("--per-category must be >= 1")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise InvalidParameterError("--max-tokens must be >= 1")
    if args.which == "batch" and args.repeats < 1:
        raise InvalidParameterError("--repeats must be >= 1")
    set_threads(args.threads)
    if args.precision != "fp32" and (args.toy or args.which in ("evidence", "runtimes")):
        raise InvalidParameterError(
            "--precision picks the real target's runtime for tree, batch, chunked and history "
            "(not --toy; runtimes takes --precisions)"
        )
    if args.which == "evidence":
        if args.out is not None:
            raise InvalidParameterError("evidence writes --out-dir and --report, not --out")
        return run_evidence(args)
    if args.out is not None:  # before any work: a run whose results cannot be written is lost
        output_file(args.out, "--out", make_parents=True)
    if args.which == "runtimes":
        _write(args.out, {"command": args.command_line, **_runtimes(args)})
        return 0
    setup = (
        toy_setup()
        if args.toy
        else load_setup(
            args.target,
            args.draft,
            per_category=args.per_category,
            any_drafter=args.which == "history" or args.precision == LLAMACPP,
            precision=args.precision,
        )
    )
    report: dict[str, Any] = {
        "setup": setup.description,
        "prompts": len(setup.prompts),
        "command": args.command_line,
    }
    if args.which == "tree":
        report["tree_vs_chain"] = _tree(setup, args)
    elif args.which == "batch":
        report.update(_batch(setup, args))
    elif args.which == "history":
        report["history"] = _history(setup, args)
    else:
        report.update(_chunked(setup, args))
    _write(args.out, report)
    return 0


def _write(out: Path | None, report: dict[str, Any]) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    Console().print(table)


def _history(setup: Setup, args: argparse.Namespace) -> list[dict[str, float | int | str]]:
    from spectune.experiments.history import history_acceptance

    windows = history_acceptance(
        setup,
        requests=args.requests,
        window=args.window,
        history_tokens=args.history_tokens,
        max_tokens=args.max_tokens or 64,
        temperature=args.temperature,
    )
    _table(
        f"Acceptance as outputs accumulate ({setup.description}, K=4, T={args.temperature})",
        [
            "requests",
            "drafted",
            "accepted",
            "acceptance",
            "tokens/step",
            "draft ms",
            "p99 ms",
            "of target",
        ],
        [
            [
                w.label.removeprefix("requests "),
                w.drafted,
                w.accepted,
                w.acceptance,
                w.mean_accepted_length,
                w.draft_ms_mean,
                w.draft_ms_p99,
                f"{w.draft_over_target:.2%}",
            ]
            for w in windows
        ],
    )
    return [w.as_dict() for w in windows]


def _tree(setup: Setup, args: argparse.Namespace) -> list[dict[str, object]]:
    from spectune.experiments.trees import speedup, tree_vs_chain

    results = tree_vs_chain(
        setup,
        budgets=args.budgets,
        widths=args.widths,
        min_path_prob=args.min_path_prob,
        temperatures=args.temperatures,
        max_tokens=args.max_tokens or 32,
    )
    rows: list[list[Any]] = []
    shown: list[object] = []
    for r in results:
        stats_rows = [s for s in (r.plain, r.chain) if not any(s is x for x in shown)]
        shown += stats_rows
        for stats in [*stats_rows, r.tree]:
            rows.append(
                [
                    r.temperature,
                    stats.label,
                    stats.target_tokens_per_step,
                    stats.mean_accepted_length,
                    stats.tokens_per_second,
                    f"{speedup(stats, r.plain):.2f}x",
                ]
            )
        gains = [f"{r.accepted_length_gain:+.1%}", f"{r.speed_gain:+.1%}", ""]
        rows.append(["", "tree vs chain", "", *gains])
    _table(
        f"Tree vs chain at equal target cost ({setup.description})",
        ["T", "drafter", "target tokens/step", "mean accepted length", "tokens/s", "vs plain"],
        rows,
    )
    return [r.as_dict() for r in results]


def _batch(setup: Setup, args: argparse.Namespace) -> dict[str, object]:
    from spectune.control.crossover import runtime_of, save_crossover
    from spectune.experiments.batching import batch_sweep, crossover

    points = batch_sweep(
        setup, args.sizes, ks=args.k, max_tokens=args.max_tokens or 32, repeats=args.repeats
    )
    best = crossover(points)
    rows = []
    for size in args.sizes:
        plain = next(p for p in points if p.batch == size and not p.speculative)
        row: list[Any] = [size, plain.tokens_per_second]
        for k in args.k:
            spec = next(p for p in points if p.batch == size and p.k == k)
            row.append(spec.tokens_per_second / max(plain.tokens_per_second, 1e-9))
        rows.append(row)
    _table(
        f"Batch throughput with and without speculation ({setup.description})",
        ["batch", "plain tokens/s", *(f"K={k} speedup" for k in args.k)],
        rows,
    )
    result: dict[str, object] = {
        "ks": list(args.k),
        "points": [p.as_dict() for p in points],
        "speculate_max_batch": best,
    }
    print(f"crossover: speculation pays up to batch size {best}")
    if setup.stand_in:
        print("not recorded: toy models or a stand-in draft say nothing about a real draft")
    elif not args.no_save:
        detail: dict[str, object] = {
            "ks": list(args.k),
            "repeats": args.repeats,
            "sizes": list(args.sizes),
            "command": args.command_line,
        }
        path = save_crossover(
            setup.target.info,
            best,
            detail,
            draft=setup.draft.name,
            runtime=runtime_of(setup.target),
        )
        print(f"recorded for BatchEngine in {path}")
        result["saved_to"] = str(path)
    return result


def _chunked(setup: Setup, args: argparse.Namespace) -> dict[str, object]:
    from spectune.experiments.chunked import chunked_vs_one_pass

    curve, rows = chunked_vs_one_pass(
        setup,
        ks=args.ks,
        groups=args.groups,
        temperature=args.temperature,
        max_tokens=args.max_tokens or 32,
    )
    _table(
        f"Chunked vs one-pass verification ({setup.description})",
        ["K", "groups", "tokens/s", "target tokens/step", "acceptance", "predicted cost", "pays"],
        [
            [
                r.k,
                r.groups,
                r.stats.tokens_per_second,
                r.target_tokens / max(1, r.stats.steps),
                r.acceptance_rate,
                r.predicted_cost,
                r.predicted_pays,
            ]
            for r in rows
        ],
    )
    return {
        "cost_curve": {"sizes": list(curve.sizes), "seconds": list(curve.seconds)},
        "rows": [r.as_dict() for r in rows],
    }


def _runtime_name(name: str) -> str:
    """A ``--precisions`` entry as the runtimes table names it: ``llamacpp``, a precision,
    or a precision with ``+compile``."""
    from spectune.cli.common import parse_precision
    from spectune.models.llama import COMPILED

    if name == LLAMACPP:
        return name
    base = name.removesuffix(COMPILED)
    return parse_precision(base).name + name[len(base) :]


def _runtimes(args: argparse.Namespace) -> dict[str, object]:
    import torch

    from spectune.control.crossover import runtime_of, save_verify_curve
    from spectune.drafters.pairing import compile_target, native_precision
    from spectune.experiments.common import toy_setup
    from spectune.experiments.runtimes import compare_runtimes
    from spectune.models.base import LanguageModel
    from spectune.models.devices import machine_of
    from spectune.models.llama import COMPILED

    # "llamacpp": the GGUF on llama.cpp's kernels (its own tensor types), not a precision;
    # "PRECISION+compile": that precision with its one-token steps compiled.
    names = [_runtime_name(name) for name in args.precisions.split(",") if name]
    precisions = [native_precision(n) for n in names if n != LLAMACPP]
    if not names:
        raise InvalidParameterError("--precisions: give at least one")
    if args.toy and LLAMACPP in names:
        raise InvalidParameterError("--precisions llamacpp needs a GGUF target, not --toy")
    models: dict[str, LanguageModel] = {}
    prompts: list[tuple[int, ...]]
    if args.toy:
        import copy

        from spectune.models.llama import LlamaLM
        from spectune.models.quant import quantize_net

        base = toy_setup()
        assert isinstance(base.target, LlamaLM)
        for name, precision in zip(names, precisions, strict=True):
            net = copy.deepcopy(base.target.net).to(precision.dtype)
            quantize_net(net, precision.quantize)
            models[name] = LlamaLM(net, name=base.target.info.name)
            if name.endswith(COMPILED):
                compile_target(models[name])
        prompts = [tokens for _, tokens in base.prompts]
        description = "toy target"
    else:
        from spectune.drafters.pairing import load_target_at
        from spectune.prompts import load_prompts

        for name in names:
            loaded = load_target_at(args.target, name)
            models[name] = loaded.model
        prompts = [
            tuple(p.tokens(loaded.tokenizer))
            for p in load_prompts(split="test", limit_per_category=args.per_category)
        ]
        description = f"{loaded.model.info.name}, test prompts"
    results = compare_runtimes(models, prompts, max_tokens=args.max_tokens or 48)
    reference = names[0]
    base_speed = max(results[0].tokens_per_second, 1e-9)
    _table(
        f"Runtimes ({description}, {len(prompts)} prompts, {torch.get_num_threads()} threads; "
        f"against {reference})",
        ["precision", "tokens/s", "speed", "max |dlogit|", "mean |dlogit|", "same", "prefix"],
        [
            [
                r.precision,
                r.tokens_per_second,
                f"{r.tokens_per_second / base_speed:.2f}x",
                r.max_logit_error,
                r.mean_logit_error,
                f"{r.identical}/{r.prompts}",
                r.prefix_agreement,
            ]
            for r in results
        ],
    )
    _table(
        "Verification cost v(k): a forward over k + 1 tokens / one token",
        ["precision", *(f"v({n - 1})" for n in results[0].curve.sizes[1:])],
        [[r.precision, *(s / r.curve.seconds[0] for s in r.curve.seconds[1:])] for r in results],
    )
    # What generate and serve start the cost policy from on this machine (crossover.py).
    measured = f"{time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} threads"
    for r in results:
        model = models[r.precision]
        path = save_verify_curve(
            model.info,
            r.curve,
            {"verify_curve_command": args.command_line, "verify_curve_measured": measured},
            runtime=runtime_of(model),
            machine=machine_of(model),
        )
    print(f"recorded the verification curves in {path}")
    return {
        "setup": description,
        "prompts": len(prompts),
        "threads": torch.get_num_threads(),
        "runtimes": [r.as_dict() for r in results],
    }
