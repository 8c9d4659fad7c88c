"""vLLM's metrics dialect: its ``spec_decode`` counters as spectune's counts.

Counters ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens``
and ``_num_accepted_tokens_per_pos{position}`` (0-based, one label per speculative token:
K is their number). A draft tests every position, so positions tested = draft tokens.
vLLM exports no draft time and no fallback counts. Label sets other than ``position``
(``engine``, ``model_name``) are summed over.
"""

from __future__ import annotations

from spectune.monitor.remote import EngineReading, Exposition, counters_reading, missing_metrics

__all__ = ["read_vllm"]


def read_vllm(ex: Exposition) -> EngineReading:
    reading = counters_reading(
        "vllm", ex, "vllm:", "vLLM exports no draft time and no fallback counts"
    )
    if reading is None:
        raise missing_metrics(
            "vLLM",
            "vllm:spec_decode_* counters: is speculative decoding on (--speculative-config)?",
        )
    return reading
