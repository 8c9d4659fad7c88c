"""SGLang's metrics dialect: gauges only, ``sglang:spec_accept_rate`` and
``sglang:spec_accept_length``, the last batch's values. No counters, so no window and no
per-position acceptance.
"""

from __future__ import annotations

from spectune.monitor.remote import EngineReading, Exposition, missing_metrics

__all__ = ["read_sglang"]


def read_sglang(ex: Exposition) -> EngineReading:
    """SGLang's two acceptance gauges (the mean over ranks)."""
    rate = ex.gauge("sglang:spec_accept_rate")
    length = ex.gauge("sglang:spec_accept_length")
    if rate is None and length is None:
        raise missing_metrics(
            "SGLang", "sglang:spec_accept_rate or _length: is --speculative-algorithm set?"
        )
    return EngineReading(
        "sglang",
        None,
        reported_acceptance=rate,
        reported_accepted_length=length,
        notes=(
            "SGLang exports its last batch's acceptance as gauges, no counters: no window, "
            "no per-position acceptance",
        ),
    )
