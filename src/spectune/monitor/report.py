"""Turn a recorded step trace into time series, PNG charts and a health summary.

The trace is replayed through the same ``SpecStats`` the live monitor uses, so the
report's numbers are the monitor's. The x axis is the step number across the whole
trace (requests in the order they began); dotted vertical lines mark request starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spectune.monitor.health import HealthCheck, health
from spectune.monitor.stats import SpecStats, StatsSnapshot, StepNumbers, fallback_kind
from spectune.monitor.trace import TraceRequest
from spectune.records import SpecCounts

__all__ = ["PLOTS", "TraceReport", "analyse_trace", "peak_by_k", "plot_report"]

PLOTS = ("report.png",)


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
    """Write ``PLOTS`` (one figure: four panels over the same steps) into ``out_dir``;
    returns their paths.

    Panels, top to bottom: acceptance (the window and EWMA lines; faint dots for single
    steps), K with the steps decoded plainly shaded by fallback kind, the draft latency
    share against its 40% limit, and the verification peak memory. Dotted lines mark
    request starts. The health bands are drawn where they are thresholds of the report's
    summary (the 60-85% acceptance band, the 40% share limit)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = len(report.k)
    fig, axes = plt.subplots(4, 1, figsize=(10, 8.5), sharex=True, height_ratios=(3, 2, 1.5, 1.5))
    accept_ax, k_ax, share_ax, peak_ax = axes

    accept_ax.axhspan(0.60, 0.85, color="tab:green", alpha=0.08, label="health band 60-85%")
    xs, ys = _series(report.step_acceptance)
    accept_ax.scatter(xs, ys, s=4, color="0.75", label="one step", zorder=1)
    xs, ys = _series(report.window_acceptance)
    accept_ax.plot(xs, ys, color="tab:blue", linewidth=1.8, label="window", zorder=3)
    xs, ys = _series(report.ewma_acceptance)
    accept_ax.plot(xs, ys, color="tab:orange", linewidth=1, label="EWMA", zorder=2)
    accept_ax.set_ylim(-0.03, 1.03)
    accept_ax.set_ylabel("accepted / tested")
    accept_ax.set_title("Acceptance rate", loc="left")
    accept_ax.legend(loc="upper right", fontsize="small", ncols=4, framealpha=0.9)

    k_ax.step(range(steps), report.k, where="mid", color="tab:purple", linewidth=1.2)
    kinds = sorted({k for k in report.fallbacks if k is not None})
    for index, kind in enumerate(kinds):
        hits = [i for i, k in enumerate(report.fallbacks) if k == kind]
        for i in hits:
            k_ax.axvspan(i - 0.5, i + 0.5, color=f"C{index + 1}", alpha=0.25, linewidth=0)
        k_ax.plot([], [], color=f"C{index + 1}", alpha=0.4, linewidth=6, label=f"{kind} fallback")
    k_ax.set_ylim(-0.3, max(report.k, default=1) + 0.7)
    k_ax.set_ylabel("K")
    k_ax.set_title("K asked per step (0: plain decoding)", loc="left")
    if kinds:
        k_ax.legend(loc="upper right", fontsize="small", ncols=len(kinds), framealpha=0.9)

    xs, ys = _series(report.window_draft_share)
    share_ax.plot(xs, [100 * y for y in ys], color="tab:blue")
    share_ax.axhline(40, color="tab:red", linestyle="--", linewidth=1, label="limit 40%")
    share_ax.set_ylim(0, max([50.0, *(100 * y for y in ys)]) * 1.05)
    share_ax.set_ylabel("% of step time")
    share_ax.set_title("Draft latency share (window)", loc="left")
    share_ax.legend(loc="upper right", fontsize="small")

    xs, peaks = _series(tuple(None if p is None else p / 2**20 for p in report.verify_peak_bytes))
    peak_ax.plot(xs, peaks, color="tab:gray", linewidth=1)
    peak_ax.set_ylim(0, max([0.1, *peaks]) * 1.15)
    peak_ax.set_ylabel("MiB")
    peak_ax.set_title("Verification peak memory", loc="left")
    peak_ax.set_xlabel("step")
    peak_ax.set_xlim(-0.5, max(steps, 1) - 0.5)

    for ax in axes:
        for start in report.request_starts[1:]:
            ax.axvline(start, color="0.6", linestyle=":", linewidth=0.8)
        ax.grid(axis="y", color="0.92")
    snap = report.snapshot
    fig.suptitle(
        f"spectune report: {snap.steps} steps, {report.requests} request(s)", x=0.01, ha="left"
    )
    fig.tight_layout()
    path = out / PLOTS[0]
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
