"""Live monitoring of speculative decoding: counters, rates, Prometheus, trace, report.

- ``stats``       counters fed from ``StepRecord``s and the rates derived from them
                  (total, sliding window, EWMA) as a frozen ``StatsSnapshot``.
- ``hub``         ``Monitor`` (across requests) and ``RequestMonitor`` (one request):
                  where callers send records.
- ``prometheus``  ``spectune_spec_decode_*`` metrics on a caller-owned registry.
- ``trace``       the JSON-lines step trace and its reader.
- ``health``      the targets and the ok/low/high verdicts.
- ``report``      a trace replayed into series, PNG charts and a health summary.
"""

from spectune.monitor.health import TARGETS, HealthCheck, health
from spectune.monitor.hub import Monitor, RequestMonitor
from spectune.monitor.prometheus import PrometheusExporter
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

__all__ = [
    "FALLBACK_KINDS",
    "PLOTS",
    "TARGETS",
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
    "analyse_trace",
    "fallback_kind",
    "health",
    "plot_report",
    "read_trace",
]
