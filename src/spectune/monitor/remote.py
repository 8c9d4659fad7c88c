"""Readers for a running engine's own speculation counters, each an adapter to ``SpecCounts``.

One verb per reader: ``read(text) -> EngineReading``, the engine's Prometheus exposition
parsed with ``prometheus_client``'s text parser. What each engine exports (names as in the
engines' sources; tests/fixtures/watch/ holds one exposition of each):

- ``vllm``      counters ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``,
                ``_num_accepted_tokens`` and ``_num_accepted_tokens_per_pos{position}``
                (0-based, one label per speculative token: K is their number). A draft tests
                every position, so positions tested = draft tokens. No draft time, no fallback.
- ``sglang``    gauges only: ``sglang:spec_accept_rate`` and ``sglang:spec_accept_length``,
                the last batch's values. No counters, so no window and no per position.
- ``llamacpp``  ``llama-server --metrics``: vLLM's counters under the ``llamacpp:`` prefix
                (``llamacpp:spec_decode_num_drafts_total`` ... ``_per_pos_total{position}``,
                one label per position up to ``--spec-draft-n-max``), beside
                ``llamacpp:tokens_predicted_total``. Builds older than the llama.cpp that
                llama-cpp-python 0.3.36 vendors export no draft counts; there they come only
                with each response, in ``timings.draft_n`` / ``timings.draft_n_accepted``
                (``counts_of_timings``).
- ``spectune``  ``spectune serve``'s ``spectune_spec_decode_*``: every count ``SpecCounts``
                holds, draft and step time and fallback steps included.

Label sets other than ``position`` (vLLM's ``engine``, ``model_name``) are summed over.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from spectune.errors import SpectuneError
from spectune.records import SpecCounts

__all__ = [
    "READERS",
    "EndpointError",
    "EngineReading",
    "Exposition",
    "counts_of_timings",
    "detect_engine",
    "excerpt",
    "read_exposition",
]


class EndpointError(SpectuneError):
    """The endpoint cannot be read, or what it serves is not an engine's speculation metrics."""


EXCERPT_CHARS = 60


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` as an error line may quote what a server sent: at most ``limit``
    characters, anything but printable ASCII escaped (``\\x1b``, ``\\u2028``), so that no
    byte of it reaches the terminal as a control sequence or a line break."""
    cut = text[:limit]
    shown = cut.encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)
    return shown + ("..." if len(text) > limit else "")


@dataclass(frozen=True)
class EngineReading:
    """One scrape of an engine, as spectune's counts.

    ``counts`` are cumulative since the engine started (None: the engine exports no
    counters, only ``reported_*`` gauges). ``measured`` names the counts the engine really
    exports among ``draft_time`` (draft share), ``fallback`` and ``per_position``; the
    others stay 0 in ``counts`` and their rates are not judged."""

    engine: str
    counts: SpecCounts | None
    measured: frozenset[str] = frozenset()
    k: int | None = None  # draft tokens per step the engine is set to, where it says
    reported_acceptance: float | None = None  # the engine's own gauge (SGLang)
    reported_accepted_length: float | None = None
    notes: tuple[str, ...] = ()  # what the engine does not export, said once per reading


@dataclass
class Exposition:
    """Samples of one exposition by name (``_total`` kept as exposed), summed by label."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Exposition:
        exposition = cls()
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    exposition.samples.setdefault(sample.name, []).append(
                        (dict(sample.labels), float(sample.value))
                    )
        except (ValueError, TypeError, IndexError) as exc:
            raise EndpointError(f"not Prometheus text ({excerpt(str(exc))})") from None
        return exposition

    def names(self) -> set[str]:
        return set(self.samples)

    def total(self, *names: str) -> float | None:
        """The sum over label sets of the first of ``names`` present (None: none is)."""
        for name in names:
            if name in self.samples:
                return sum(v for _, v in self.samples[name] if not math.isnan(v))
        return None

    def by_label(self, name: str, label: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for labels, value in self.samples.get(name, []):
            if label in labels and labels[label].isdigit():
                key = int(labels[label])
                out[key] = out.get(key, 0.0) + value
        return out

    def gauge(self, name: str) -> float | None:
        """The mean over label sets (ranks) of a gauge, NaN left out."""
        values = [v for _, v in self.samples.get(name, []) if not math.isnan(v)]
        return sum(values) / len(values) if values else None


def _count(value: float | None) -> int:
    return 0 if value is None else round(value)


def _missing(engine: str, what: str) -> EndpointError:
    return EndpointError(f"the {engine} metrics hold no {what}")


def _vllm_style(ex: Exposition, prefix: str) -> tuple[SpecCounts, int | None] | None:
    """vLLM's four ``spec_decode`` counters under ``prefix`` (llama.cpp exports the same
    names); None when the three totals are not all there."""
    p = f"{prefix}spec_decode_"
    drafts = ex.total(f"{p}num_drafts_total", f"{p}num_drafts")
    draft_tokens = ex.total(f"{p}num_draft_tokens_total", f"{p}num_draft_tokens")
    accepted = ex.total(f"{p}num_accepted_tokens_total", f"{p}num_accepted_tokens")
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    per_pos = ex.by_label(f"{p}num_accepted_tokens_per_pos_total", "position") or ex.by_label(
        f"{p}num_accepted_tokens_per_pos", "position"
    )
    k = max(per_pos) + 1 if per_pos else None  # one label per speculative token, 0-based
    counts = SpecCounts(
        steps=_count(drafts),
        num_draft_tokens=_count(draft_tokens),
        positions=_count(draft_tokens),  # a draft tests all of its tokens
        accepted=_count(accepted),
    )
    if k is not None:
        counts.tested_at = [_count(drafts)] * k
        counts.accepted_at = [_count(per_pos.get(j)) for j in range(k)]
    return counts, k


def read_vllm(ex: Exposition) -> EngineReading:
    found = _vllm_style(ex, "vllm:")
    if found is None:
        raise _missing(
            "vLLM",
            "vllm:spec_decode_* counters: is speculative decoding on (--speculative-config)?",
        )
    counts, k = found
    return EngineReading(
        "vllm",
        counts,
        frozenset({"per_position"} if k is not None else set()),
        k=k,
        notes=("vLLM exports no draft time and no fallback counts",),
    )


def read_sglang(ex: Exposition) -> EngineReading:
    rate = ex.gauge("sglang:spec_accept_rate")
    length = ex.gauge("sglang:spec_accept_length")
    if rate is None and length is None:
        raise _missing(
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


def read_llamacpp(ex: Exposition) -> EngineReading:
    if ex.total("llamacpp:tokens_predicted_total") is None:
        raise _missing("llama.cpp", "llamacpp:tokens_predicted_total (is --metrics on?)")
    found = _vllm_style(ex, "llamacpp:")
    if found is None:  # a build from before llama-server counted drafts
        return EngineReading(
            "llamacpp",
            None,
            notes=(
                "this llama-server's /metrics holds no draft counts (an older build); each "
                "response's timings.draft_n / draft_n_accepted does",
            ),
        )
    counts, k = found
    return EngineReading(
        "llamacpp",
        counts,
        frozenset({"per_position"} if k is not None else set()),
        k=k,
        notes=("llama-server exports no draft time and no fallback counts",),
    )


def read_spectune(ex: Exposition) -> EngineReading:
    p = "spectune_spec_decode_"
    steps = ex.total(f"{p}num_steps_total")
    if steps is None:
        raise _missing("spectune", "spectune_spec_decode_num_steps_total")
    drafted = _count(ex.total(f"{p}num_draft_tokens_total"))
    tested = ex.by_label(f"{p}num_draft_tokens_per_pos_total", "position")  # 1-based
    kept = ex.by_label(f"{p}num_accepted_tokens_per_pos_total", "position")
    width = max(tested, default=0)
    k = ex.total(f"{p}k")
    counts = SpecCounts(
        steps=_count(steps),
        num_draft_tokens=drafted,
        positions=drafted,  # the exporter counts a tree's depth here
        accepted=_count(ex.total(f"{p}num_accepted_tokens_total")),
        emitted=_count(ex.total(f"{p}num_emitted_tokens_total")),
        fallback_steps=_count(ex.total(f"{p}fallback_steps_total")),
        draft_time=ex.total(f"{p}draft_time_seconds_sum") or 0.0,
        target_time=ex.total(f"{p}target_time_seconds_sum") or 0.0,
        step_time=ex.total(f"{p}step_time_seconds_sum") or 0.0,
        tested_at=[_count(tested.get(j)) for j in range(1, width + 1)],
        accepted_at=[_count(kept.get(j)) for j in range(1, width + 1)],
    )
    return EngineReading(
        "spectune",
        counts,
        frozenset({"draft_time", "fallback", "per_position"}),
        # The widest draft tested: the last step's K gauge is cut short near max_tokens
        # and 0 after a plain step.
        k=width or (round(k) if k is not None and not math.isnan(k) and k > 0 else None),
    )


READERS: Mapping[str, Callable[[Exposition], EngineReading]] = {
    "vllm": read_vllm,
    "sglang": read_sglang,
    "llamacpp": read_llamacpp,
    "spectune": read_spectune,
}
_PREFIXES = {
    "vllm": "vllm:",
    "sglang": "sglang:",
    "llamacpp": "llamacpp:",
    "spectune": "spectune_spec_decode_",
}


def detect_engine(ex: Exposition) -> str:
    """The engine whose metric names the exposition holds."""
    for engine, prefix in _PREFIXES.items():
        if any(name.startswith(prefix) for name in ex.names()):
            return engine
    raise EndpointError(
        "no vLLM, SGLang, llama.cpp or spectune metrics there (give --engine if it is one)"
    )


def read_exposition(text: str, engine: str | None = None) -> EngineReading:
    """Parse ``text`` and read it as ``engine``'s (detected from the names when None)."""
    ex = Exposition.parse(text)
    return READERS[engine or detect_engine(ex)](ex)


def counts_of_timings(timings: Mapping[str, object]) -> SpecCounts:
    """llama-server's per-response ``timings`` as counts: ``draft_n`` draft tokens tested,
    ``draft_n_accepted`` kept. It says nothing of steps, so no accepted length."""
    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    if not isinstance(drafted, int) or not isinstance(accepted, int) or accepted > drafted:
        raise EndpointError(
            f"timings without usable draft_n / draft_n_accepted: {excerpt(str(timings))}"
        )
    return SpecCounts(num_draft_tokens=drafted, positions=drafted, accepted=accepted)
