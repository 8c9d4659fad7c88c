"""Live monitoring of speculative decoding: counters, rates, Prometheus, trace, report.

- ``stats``       counters fed from ``StepRecord``s and the rates derived from them
                  (total, sliding window, EWMA) as a frozen ``StatsSnapshot``.
- ``hub``         ``Monitor`` (across requests) and ``RequestMonitor`` (one request):
                  where callers send records.
- ``prometheus``  ``spectune_spec_decode_*`` metrics on a caller-owned registry.
- ``trace``       the JSON-lines step trace and its reader.
- ``health``      the targets and the ok/low/high verdicts.
- ``report``      a trace replayed into series, PNG charts and a health summary.
- ``remote``      a running engine's /metrics as ``SpecCounts``: the shared types and
                  spectune's own dialect (the engines' live in ``spectune.engines``).
- ``watch``       a deployment judged between scrapes, and the K advice for it.
"""

from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports

if TYPE_CHECKING:
    from spectune.monitor.health import TARGETS, HealthCheck, health
    from spectune.monitor.hub import Monitor, RequestMonitor
    from spectune.monitor.prometheus import PrometheusExporter
    from spectune.monitor.remote import EndpointError, EngineReading
    from spectune.monitor.report import PLOTS, TraceReport, analyse_trace, plot_report
    from spectune.monitor.stats import (
        FALLBACK_KINDS,
        Rates,
        SpecStats,
        StatsSnapshot,
        StepNumbers,
        fallback_kind,
    )
    from spectune.monitor.trace import (
        TraceError,
        TraceRequest,
        TraceStep,
        TraceWriter,
        read_trace,
    )
    from spectune.monitor.watch import Advice, CostAssumptions, Watcher, WatchReport
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.monitor.health": ["TARGETS", "HealthCheck", "health"],
            "spectune.monitor.hub": ["Monitor", "RequestMonitor"],
            "spectune.monitor.prometheus": ["PrometheusExporter"],
            "spectune.monitor.remote": ["EndpointError", "EngineReading"],
            "spectune.monitor.report": ["PLOTS", "TraceReport", "analyse_trace", "plot_report"],
            "spectune.monitor.stats": [
                "FALLBACK_KINDS",
                "Rates",
                "SpecStats",
                "StatsSnapshot",
                "StepNumbers",
                "fallback_kind",
            ],
            "spectune.monitor.trace": [
                "TraceError",
                "TraceRequest",
                "TraceStep",
                "TraceWriter",
                "read_trace",
            ],
            "spectune.monitor.watch": ["Advice", "CostAssumptions", "Watcher", "WatchReport"],
        },
    )

__all__ = [
    "FALLBACK_KINDS",
    "PLOTS",
    "TARGETS",
    "Advice",
    "CostAssumptions",
    "EndpointError",
    "EngineReading",
    "HealthCheck",
    "Monitor",
    "PrometheusExporter",
    "Rates",
    "RequestMonitor",
    "SpecStats",
    "StatsSnapshot",
    "StepNumbers",
    "TraceError",
    "TraceReport",
    "TraceRequest",
    "TraceStep",
    "TraceWriter",
    "WatchReport",
    "Watcher",
    "analyse_trace",
    "fallback_kind",
    "health",
    "plot_report",
    "read_trace",
]
