"""``spectune watch URL``: poll a running engine's /metrics, judge its speculation, advise.

The engine (vLLM, SGLang, llama.cpp's llama-server or ``spectune serve``) is detected from
its metric names unless ``--engine`` says it. Each poll prints the window since the last
one (``spectune.monitor.watch``) as a live table; ``--once --json`` prints one JSON object
(the counts since the engine started). A poll that fails (no server, not Prometheus text,
no speculation metrics) is one line, and watching goes on; with ``--polls N``, a run whose
N polls all failed ends in an error (exit status 2). What a server sent is quoted short and
escaped (``spectune.monitor.remote.excerpt``).

A speedup is predicted (and K advised) only from the deployment's measured costs: a cost
profile (``--costs FILE``, ``spectune.engines.costs``) or ``--draft-cost`` with
``--verify-slope``; without them the report gives acceptance and a note.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.engines.costs import StepCosts, load_costs
from spectune.engines.metrics import READERS, read_exposition
from spectune.engines.names import engine_arg
from spectune.errors import InvalidParameterError
from spectune.monitor.remote import EndpointError, EngineReading, excerpt
from spectune.records import validate_k

if TYPE_CHECKING:
    from spectune.monitor.watch import Watcher, WatchReport

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="watch a vLLM, SGLang, llama.cpp or spectune server's speculation; advise K",
        description="Polls URL (its /metrics unless a path is given), derives windowed "
        "acceptance overall and per position, judges it against the health targets and "
        "prints the change to make in the engine's own flags.",
    )
    parser.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--engine",
        type=engine_arg(tuple(READERS)),
        metavar="{" + ",".join(READERS) + "}",
        default=None,
        help="(default: from the metric names; llamacpp may also be spelled llama.cpp)",
    )
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between polls")
    parser.add_argument("--once", action="store_true", help="poll once and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object per poll")
    parser.add_argument("--api-key", default=None, help="bearer key for a keyed /metrics")
    parser.add_argument(
        "-k", "--k", type=int, default=None, help="the deployment's K, where the engine omits it"
    )
    parser.add_argument("--max-k", type=int, default=8, help="largest K the advice considers")
    parser.add_argument(
        "--costs",
        type=Path,
        default=None,
        metavar="FILE",
        help="the deployment's measured costs, a cost profile (spectune.engines.costs): "
        "without it, or the two flags below, no speedup is predicted",
    )
    parser.add_argument(
        "--draft-cost",
        type=float,
        default=None,
        help="one draft token's time over one target step's, measured (with --verify-slope)",
    )
    parser.add_argument(
        "--verify-slope",
        type=float,
        default=None,
        help="extra target time per verified token over one target step's, measured "
        "(with --draft-cost)",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per poll")
    parser.add_argument(
        "--polls", type=int, default=0, help="polls before exiting (0: until interrupted)"
    )
    parser.set_defaults(run=run)


def metrics_url(url: str) -> str:
    """``url`` checked (an http(s) URL with a host and a valid port), with ``/metrics``
    added where it names no path."""
    import httpx

    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except httpx.InvalidURL as exc:
        raise InvalidParameterError(f"{excerpt(url)} is not a valid URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidParameterError(f"{excerpt(url)} is not an http(s) URL")
    if port is not None and not 0 < port < 2**16:
        raise InvalidParameterError(f"{excerpt(url)}: port {port} is not in [1, 65535]")
    return url if parsed.path.strip("/") else url.rstrip("/") + "/metrics"


def scrape(url: str, engine: str | None, api_key: str | None, timeout: float) -> EngineReading:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout)
    except httpx.ConnectError:
        raise EndpointError(f"cannot connect to {url}") from None
    except httpx.HTTPError as exc:
        raise EndpointError(f"{url}: {type(exc).__name__} {excerpt(str(exc))}".strip()) from None
    if response.status_code == 401:
        raise EndpointError(f"{url} needs an API key (--api-key)")
    if response.status_code != 200:
        raise EndpointError(f"{url} answered HTTP {response.status_code}")
    try:
        return read_exposition(response.text, engine)
    except EndpointError as exc:
        raise EndpointError(f"{url}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from spectune.monitor.watch import Watcher

    if args.interval <= 0 or args.timeout <= 0:
        raise InvalidParameterError("--interval and --timeout must be > 0")
    if args.polls < 0:
        raise InvalidParameterError("--polls must be >= 0")
    validate_k(args.max_k)  # the advice's table of K (and stated costs) stops there
    if args.k is not None and args.k < 0:
        raise InvalidParameterError("-k must be >= 0")
    url = metrics_url(args.url)
    _check_api_key(args.api_key)
    watcher = Watcher(_costs(args), args.k, args.max_k)
    if args.once:
        report = watcher.observe(scrape(url, args.engine, args.api_key, args.timeout))
        print(json.dumps(report.as_json(), indent=2) if args.json else _text(report))
        return 0
    failures: list[EndpointError] = []
    if args.json:
        for _ in _polls(args):
            try:
                report = watcher.observe(scrape(url, args.engine, args.api_key, args.timeout))
                print(json.dumps(report.as_json()), flush=True)
            except EndpointError as exc:
                failures.append(exc)
                print(json.dumps({"error": str(exc)}), flush=True)
    else:
        _live(watcher, url, args, failures)
    if args.polls and len(failures) == args.polls:
        raise EndpointError(f"all {args.polls} polls failed; the last: {failures[-1]}")
    return 0


def _costs(args: argparse.Namespace) -> StepCosts | None:
    """The measured costs the advice predicts from: a cost profile (``--costs``), or
    ``--draft-cost`` with ``--verify-slope``; None: no speedup is predicted."""
    from spectune.monitor.watch import CostAssumptions

    stated = (args.draft_cost, args.verify_slope)
    if args.costs is not None:
        if stated != (None, None):
            raise InvalidParameterError(
                "give --costs or --draft-cost with --verify-slope, not both"
            )
        return load_costs(args.costs)
    if stated == (None, None):
        return None
    if None in stated:
        raise InvalidParameterError("--draft-cost and --verify-slope go together: give both")
    if not all(math.isfinite(x) and x >= 0 for x in stated):
        raise InvalidParameterError("--draft-cost and --verify-slope must be finite and >= 0")
    return CostAssumptions(args.draft_cost, args.verify_slope).stated(args.max_k)


def _check_api_key(key: str | None) -> None:
    """A key that cannot go into an HTTP header fails here, not in every poll."""
    if key is not None and (not key.isascii() or not key.isprintable() or not key.strip()):
        raise InvalidParameterError("--api-key must be printable ASCII text")


def _polls(args: argparse.Namespace) -> Iterator[int]:
    """Poll numbers, with ``--interval`` between them, ``--polls`` of them (0: forever)."""
    n = 0
    while args.polls == 0 or n < args.polls:
        if n:
            time.sleep(args.interval)
        yield n
        n += 1


def _live(
    watcher: Watcher, url: str, args: argparse.Namespace, failures: list[EndpointError]
) -> None:
    """The live table, one poll at a time; failed polls are lines above it (and added to
    ``failures``)."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with Live(console=console, auto_refresh=False) as live:
        for _ in _polls(args):
            try:
                report = watcher.observe(scrape(url, args.engine, args.api_key, args.timeout))
                live.update(_table(report, url), refresh=True)
            except EndpointError as exc:
                failures.append(exc)
                live.console.print(f"spectune: {exc}; still watching", markup=False, soft_wrap=True)


def _rows(report: WatchReport) -> list[tuple[str, str, str]]:
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

    c = report.counts
    rows = [("window", report.window, "")]
    if c is not None:
        rows.append(
            ("steps / draft tokens / accepted", f"{c.steps} / {c.positions} / {c.accepted}", "")
        )
    rows.append(
        (
            "mean accepted length",
            "n/a" if report.accepted_length is None else f"{report.accepted_length:.2f}",
            "",
        )
    )
    for check in report.checks:
        rows.append((check.target.label, check.shown(), f"{check.status} ({check.target.band()})"))
    if report.kept_by_position:
        rows.append(
            ("acceptance by position", " ".join(pct(x) for x in report.kept_by_position), "")
        )
    if report.advice is not None:
        a = report.advice
        rows.append(
            ("advice", f"{a.action} K -> {a.k}" if a.k else "disable speculation", a.reason)
        )
        if a.change and report.breach:
            rows.append(("change", a.change, ""))
    for note in report.notes:
        rows.append(("note", note, ""))
    return rows


def _text(report: WatchReport) -> str:
    return "\n".join(
        f"{name}: {value}" + (f"  [{extra}]" if extra else "")
        for name, value, extra in _rows(report)
    )


def _table(report: WatchReport, url: str) -> Any:
    from rich.table import Table

    table = Table(title=f"{report.engine} at {url}")
    for column in ("", "value", "verdict"):
        table.add_column(column)
    for row in _rows(report):
        table.add_row(*row)
    return table
