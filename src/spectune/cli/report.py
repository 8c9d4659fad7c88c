"""``spectune report TRACE``: charts and a health summary from a recorded step trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.cli.paths import output_folder
from spectune.errors import InvalidParameterError

if TYPE_CHECKING:
    from spectune.monitor.report import TraceReport

__all__ = ["register"]

STATUS_STYLE = {"ok": "green", "low": "yellow", "high": "red", "n/a": "dim"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="plot a step trace (--trace output) and judge its health"
    )
    parser.add_argument("trace", help="a JSON-lines step trace written with --trace")
    parser.add_argument(
        "--out", default=None, help="folder for the PNGs (default: TRACE without .jsonl + _report)"
    )
    parser.add_argument(
        "--baseline-tps",
        type=float,
        default=None,
        help="plain-decoding tokens/s for the speedup (default: recorded or measured)",
    )
    parser.add_argument("--window", type=int, default=32, help="steps in the sliding window")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spectune.monitor.report import analyse_trace, plot_report
    from spectune.monitor.trace import read_trace

    if args.window < 1:
        raise InvalidParameterError(f"--window must be >= 1, got {args.window}")
    if args.baseline_tps is not None and not args.baseline_tps > 0:
        raise InvalidParameterError(f"--baseline-tps must be > 0, got {args.baseline_tps}")
    trace = Path(args.trace)
    out = output_folder(args.out or trace.with_name(trace.stem + "_report"), "--out")
    requests = read_trace(trace)
    report = analyse_trace(
        requests, baseline_tokens_per_second=args.baseline_tps, window=args.window
    )
    paths = plot_report(report, out)
    print_report(report, paths)
    return 0


def print_report(report: TraceReport, paths: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    from spectune.monitor.report import peak_by_k

    snap = report.snapshot
    console = Console()
    table = Table(title=f"Health over {snap.steps} steps, {report.requests} request(s)")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_column("status")
    for check in report.health:
        style = STATUS_STYLE[check.status]
        table.add_row(
            check.target.label, check.shown(), check.target.band(), f"[{style}]{check.status}"
        )
    console.print(table)
    mal = snap.total.mean_accepted_length
    tps = snap.total.tokens_per_second
    console.print(
        f"drafted {snap.drafted}, accepted {snap.accepted}, emitted {snap.emitted}; "
        f"mean accepted length {mal or 0.0:.2f}; {tps or 0.0:.1f} tokens/s"
    )
    if snap.baseline_source is not None and snap.baseline_tokens_per_second:
        console.print(
            f"baseline {snap.baseline_tokens_per_second:.1f} tokens/s ({snap.baseline_source})"
        )
    else:
        console.print("speedup n/a: no plain-decoding baseline (use --baseline-tps)")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(snap.fallback_events.items())) or "none"
    console.print(f"fallback events: {kinds}")
    peaks = peak_by_k(report)
    if peaks:
        by_k = ", ".join(f"K={k} {peak / 2**20:.2f}" for k, peak in peaks.items())
        console.print(
            f"verification peak memory: max {max(peaks.values()) / 2**20:.2f} MiB; by K (MiB): "
            f"{by_k}"
        )
    else:
        console.print("verification peak memory: not recorded in this trace")
    for path in paths:
        console.print(f"wrote {path}")
