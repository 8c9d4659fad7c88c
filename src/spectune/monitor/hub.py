"""Where step records go: per-request and aggregated statistics, Prometheus, the trace.

Usage (the CLI, the server and the benchmark all do this)::

    monitor = Monitor(registry=CollectorRegistry(), trace=TraceWriter("run.jsonl"))
    watch = monitor.request(policy=policy, info={"policy": "threshold"})
    for record in watch.watch(engine.generate(prompt, params, policy=policy)):
        ...
    watch.snapshot()     # this request
    monitor.snapshot()   # every request so far

The engine never sees the monitor: it only yields records. The aggregate takes records
from several threads (a server's requests) behind one lock.

Stalled speculation: when a request's first ``STALL_STEPS`` steps all fell back for the same
reason (a drafter that fails every step, a policy that never drafts), the monitor calls
``on_warning`` once per reason with one line naming it; the CLI prints it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from spectune.control.base import KPolicy, ReportsState
from spectune.control.costs import CostCurve
from spectune.monitor.prometheus import PrometheusExporter
from spectune.monitor.stats import SpecStats, StatsSnapshot
from spectune.monitor.trace import TraceWriter
from spectune.records import StepRecord

__all__ = ["STALL_STEPS", "Monitor", "RequestMonitor"]

STALL_STEPS = 8  # leading steps that, all falling back for one reason, draw a warning


class Monitor:
    """Statistics across requests; hands out one ``RequestMonitor`` per request.

    window, smoothing            the sliding window (steps) and EWMA weight of the rates.
    baseline_tokens_per_second   plain-decoding rate for the estimated speedup, if known.
    cost_curve                   predicts the baseline when none is given or measured.
    registry                     exports Prometheus metrics there (None: no exporter).
    trace                        writes the JSON-lines step trace there (None: no trace).
    on_warning                   hears one line per stalled-speculation reason (see above).
    """

    def __init__(
        self,
        *,
        window: int = 32,
        smoothing: float = 0.1,
        baseline_tokens_per_second: float | None = None,
        cost_curve: CostCurve | None = None,
        registry: CollectorRegistry | None = None,
        trace: TraceWriter | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self._settings: dict[str, Any] = {
            "window": window,
            "smoothing": smoothing,
            "baseline_tokens_per_second": baseline_tokens_per_second,
            "cost_curve": cost_curve,
        }
        self.stats = SpecStats(**self._settings)
        self.exporter = None if registry is None else PrometheusExporter(self.snapshot, registry)
        self.trace = trace
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.on_warning = on_warning
        self.stalled: dict[str, str] = {}  # reason -> the first request it stalled

    def request(
        self,
        *,
        policy: KPolicy | None = None,
        request_id: str | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> RequestMonitor:
        """A monitor for one request; ``policy`` is asked for its state after every step."""
        rid = request_id if request_id is not None else str(next(self._ids))
        with self._lock:
            self.stats.requests += 1
            if self.exporter is not None:
                self.exporter.request_started()
        if self.trace is not None:
            self.trace.request_started(rid, dict(info or {}))
        return RequestMonitor(self, rid, policy)

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return self.stats.snapshot()

    def flush(self) -> None:
        """Put the trace written so far on disk (a trace without ``autoflush``)."""
        if self.trace is not None:
            self.trace.flush()

    def _stalled(self, request_id: str, reason: str) -> None:
        """A request's first ``STALL_STEPS`` steps all fell back for ``reason``."""
        with self._lock:
            if reason in self.stalled:
                return
            self.stalled[reason] = request_id
        if self.on_warning is not None:
            self.on_warning(
                f"the first {STALL_STEPS} steps of request {request_id} all fell back to plain "
                f"decoding: {reason}"
            )


class RequestMonitor:
    """One request's statistics; forwards every step to the aggregate, exporter and trace."""

    def __init__(self, parent: Monitor, request_id: str, policy: KPolicy | None) -> None:
        self.parent = parent
        self.request_id = request_id
        self.policy = policy
        # Asked once: a runtime-checkable protocol's isinstance is slow for a per-step check.
        self._policy_state = policy.state if isinstance(policy, ReportsState) else None
        self.stats = SpecStats(**parent._settings)
        self.stats.requests = 1
        self.finished = False
        self._leading: set[str | None] = set()  # fallback reasons of the first steps
        self._steps = 0

    def observe(self, record: StepRecord) -> None:
        if self._steps < STALL_STEPS:
            self._steps += 1
            self._leading.add(record.fallback)
            if self._steps == STALL_STEPS and len(self._leading) == 1:
                (reason,) = self._leading
                if reason is not None:
                    self.parent._stalled(self.request_id, reason)
        numbers = self.stats.observe(record)
        parent = self.parent
        with parent._lock:
            parent.stats.add(numbers)
            if parent.exporter is not None:
                parent.exporter.observe(numbers)
        if parent.trace is not None:
            state = None if self._policy_state is None else self._policy_state()
            parent.trace.step(self.request_id, record, state)
        if record.finish_reason is not None:
            self.finish()

    def watch(self, records: Iterable[StepRecord]) -> Iterator[StepRecord]:
        """Pass records through, observing each (and finishing when the stream ends)."""
        try:
            for record in records:
                self.observe(record)
                yield record
        finally:
            self.finish()

    def finish(self, *, cancelled: bool = False) -> None:
        """Write the request's summary to the trace (once); ``cancelled``: it ended
        before its finish reason (the client went away)."""
        if self.finished:
            return
        self.finished = True
        if self.parent.trace is not None:
            self.parent.trace.request_finished(
                self.request_id, self.stats.snapshot(), cancelled=cancelled
            )

    def snapshot(self) -> StatsSnapshot:
        return self.stats.snapshot()
