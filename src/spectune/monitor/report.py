"""Turn a recorded step trace into time series, PNG charts and a health summary.

The trace is replayed through the same ``SpecStats`` the live monitor uses, so the
report's numbers are the monitor's. The x axis is the step number across the whole
trace (requests in the order they began); dotted vertical lines mark request starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.monitor.health import HealthCheck, health
from spectune.monitor.stats import SpecStats, StatsSnapshot, StepNumbers, fallback_kind
from spectune.monitor.trace import TraceRequest
from spectune.records import SpecCounts

__all__ = ["PLOTS", "TraceReport", "analyse_trace", "peak_by_k", "plot_report"]

PLOTS = ("acceptance.png", "k.png", "draft_share.png", "fallbacks.png")


@dataclass(frozen=True)
class TraceReport:
    """Per-step series (one entry per step, in trace order) and the whole trace's figures."""

    requests: int
    step_acceptance: tuple[float | None, ...]  # accepted / positions tested, the step itself
    window_acceptance: tuple[float | None, ...]
    ewma_acceptance: tuple[float | None, ...]
    k: tuple[int, ...]
    window_draft_share: tuple[float | None, ...]
    fallbacks: tuple[str | None, ...]  # the step's fallback kind
    rejections: tuple[bool, ...]  # token-level fallback in the step
    request_starts: tuple[int, ...]  # step numbers where a request begins
    verify_peak_bytes: tuple[int | None, ...]  # the step's verification peak memory
    snapshot: StatsSnapshot
    health: tuple[HealthCheck, ...]


def analyse_trace(
    requests: list[TraceRequest],
    *,
    baseline_tokens_per_second: float | None = None,
    window: int = 32,
    smoothing: float = 0.1,
) -> TraceReport:
    """Replay ``requests``; the baseline is the given one, else one recorded in a request's
    info, else measured from the trace's plain steps (see ``SpecStats.baseline``)."""
    if baseline_tokens_per_second is None:
        recorded = [r.info.get("baseline_tokens_per_second") for r in requests]
        known = [float(b) for b in recorded if isinstance(b, int | float) and b > 0]
        baseline_tokens_per_second = sum(known) / len(known) if known else None
    stats = SpecStats(
        window=window, smoothing=smoothing, baseline_tokens_per_second=baseline_tokens_per_second
    )
    stats.requests = len(requests)
    step_rate: list[float | None] = []
    window_rate: list[float | None] = []
    ewma_rate: list[float | None] = []
    ks: list[int] = []
    share: list[float | None] = []
    fallbacks: list[str | None] = []
    rejections: list[bool] = []
    starts: list[int] = []
    peaks: list[int | None] = []
    for request in requests:
        starts.append(len(ks))
        previous: str | None = None
        for step in request.steps:
            record = step.record
            numbers = StepNumbers.of(record, previous)
            previous = numbers.fallback
            stats.add(numbers)
            snap = stats.snapshot()
            step_rate.append(SpecCounts.of([record]).acceptance_rate)
            window_rate.append(snap.window.acceptance_rate)
            ewma_rate.append(snap.ewma.acceptance_rate)
            ks.append(record.k)
            share.append(snap.window.draft_share)
            fallbacks.append(fallback_kind(record.fallback))
            rejections.append(numbers.rejected)
            peaks.append(record.verify_peak_bytes)
    snapshot = stats.snapshot()
    return TraceReport(
        requests=len(requests),
        step_acceptance=tuple(step_rate),
        window_acceptance=tuple(window_rate),
        ewma_acceptance=tuple(ewma_rate),
        k=tuple(ks),
        window_draft_share=tuple(share),
        fallbacks=tuple(fallbacks),
        rejections=tuple(rejections),
        request_starts=tuple(starts),
        verify_peak_bytes=tuple(peaks),
        snapshot=snapshot,
        health=tuple(health(snapshot.total)),
    )


def peak_by_k(report: TraceReport) -> dict[int, int]:
    """The highest verification peak memory (bytes) at each K, for the steps that measured it."""
    peaks: dict[int, int] = {}
    for k, peak in zip(report.k, report.verify_peak_bytes, strict=True):
        if peak is not None:
            peaks[k] = max(peak, peaks.get(k, 0))
    return dict(sorted(peaks.items()))


def _series(values: tuple[float | None, ...]) -> tuple[list[int], list[float]]:
    xs = [i for i, v in enumerate(values) if v is not None]
    return xs, [v for v in values if v is not None]


def plot_report(report: TraceReport, out_dir: str | Path) -> list[Path]:
    """Write the four PNGs of ``PLOTS`` into ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = len(report.k)
    paths: list[Path] = []

    def finish(fig: Any, ax: Any, name: str, title: str, ylabel: str) -> None:
        for start in report.request_starts[1:]:
            ax.axvline(start, color="0.8", linestyle=":", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_xlim(-0.5, max(steps, 1) - 0.5)
        path = out / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.axhspan(0.60, 0.85, color="tab:green", alpha=0.08, label="target 60-85%")
    xs, ys = _series(report.step_acceptance)
    ax.scatter(xs, ys, s=6, color="0.6", label="step")
    xs, ys = _series(report.window_acceptance)
    ax.plot(xs, ys, color="tab:blue", label="window")
    xs, ys = _series(report.ewma_acceptance)
    ax.plot(xs, ys, color="tab:orange", linewidth=1, label="EWMA")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="lower right", fontsize="small")
    finish(fig, ax, PLOTS[0], "Acceptance rate (accepted / drafted)", "acceptance")

    fig, ax = plt.subplots(figsize=(9, 3.0))
    ax.step(range(steps), report.k, where="mid", color="tab:purple")
    ax.set_ylim(-0.3, max(report.k, default=1) + 0.5)
    finish(fig, ax, PLOTS[1], "K (draft tokens asked per step; 0 = plain)", "K")

    fig, ax = plt.subplots(figsize=(9, 3.0))
    ax.axhline(0.40, color="tab:red", linestyle="--", linewidth=1, label="limit 40%")
    xs, ys = _series(report.window_draft_share)
    ax.plot(xs, ys, color="tab:blue", label="window")
    ax.set_ylim(0, max([0.5, *ys]) * 1.05)
    ax.legend(loc="upper right", fontsize="small")
    finish(fig, ax, PLOTS[2], "Draft latency share (draft time / step time)", "share")

    fig, ax = plt.subplots(figsize=(9, 3.0))
    kinds = sorted({k for k in report.fallbacks if k is not None})
    rows = ["token", *kinds]
    token_steps = [i for i, r in enumerate(report.rejections) if r]
    ax.scatter(token_steps, [0] * len(token_steps), marker="|", s=40, color="0.5")
    for row, kind in enumerate(kinds, 1):
        hits = [i for i, k in enumerate(report.fallbacks) if k == kind]
        ax.scatter(hits, [row] * len(hits), marker="|", s=80, color=f"C{row}")
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    finish(fig, ax, PLOTS[3], "Fallback events (token: rejection resampled)", "kind")
    return paths
