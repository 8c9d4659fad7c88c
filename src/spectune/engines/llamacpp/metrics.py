"""llama.cpp's metrics dialect: ``llama-server --metrics`` and each response's ``timings``.

``llama-server --metrics`` exports vLLM's counters under the ``llamacpp:`` prefix
(``llamacpp:spec_decode_num_drafts_total`` ... ``_per_pos_total{position}``, one label per
position up to ``--spec-draft-n-max``), beside ``llamacpp:tokens_predicted_total``. Builds
older than the llama.cpp that llama-cpp-python 0.3.36 vendors export no draft counts; there
they come only with each response, in ``timings.draft_n`` / ``timings.draft_n_accepted``
(``counts_of_timings``).
"""

from __future__ import annotations

from collections.abc import Mapping

from spectune.monitor.remote import (
    EndpointError,
    EngineReading,
    Exposition,
    counters_reading,
    excerpt,
    missing_metrics,
)
from spectune.records import SpecCounts

__all__ = ["counts_of_timings", "read_llamacpp"]


def read_llamacpp(ex: Exposition) -> EngineReading:
    if ex.total("llamacpp:tokens_predicted_total") is None:
        raise missing_metrics("llama.cpp", "llamacpp:tokens_predicted_total (is --metrics on?)")
    reading = counters_reading(
        "llamacpp", ex, "llamacpp:", "llama-server exports no draft time and no fallback counts"
    )
    if reading is not None:
        return reading
    # A build from before llama-server counted drafts.
    return EngineReading(
        "llamacpp",
        None,
        notes=(
            "this llama-server's /metrics holds no draft counts (an older build); each "
            "response's timings.draft_n / draft_n_accepted does",
        ),
    )


def counts_of_timings(timings: Mapping[str, object]) -> SpecCounts:
    """llama-server's per-response ``timings`` as counts: ``draft_n`` draft tokens tested,
    ``draft_n_accepted`` kept. It says nothing of steps, so no accepted length."""
    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    if not isinstance(drafted, int) or not isinstance(accepted, int) or accepted > drafted:
        raise EndpointError(
            f"timings without usable draft_n / draft_n_accepted: {excerpt(str(timings))}"
        )
    return SpecCounts(num_draft_tokens=drafted, positions=drafted, accepted=accepted)
