"""A running engine's speculation counters as spectune's counts: the types every engine's
metrics dialect shares.

``Exposition`` is one Prometheus exposition parsed with ``prometheus_client``'s text parser
(samples by name, summed over label sets); ``EngineReading`` is one scrape as ``SpecCounts``.
``spec_decode_counters`` reads vLLM's four ``spec_decode`` counters under a prefix (vLLM and
llama.cpp export the same names); ``read_spectune`` reads ``spectune serve``'s own
``spectune_spec_decode_*``: every count ``SpecCounts`` holds, draft and step time and
fallback steps included. The other engines' dialects live with each engine
(``spectune.engines``: ``vllm.metrics``, ``llamacpp.metrics``, ``sglang.metrics``), and
``spectune.engines.metrics.read_exposition`` picks the dialect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from spectune.errors import SpectuneError
from spectune.records import SpecCounts

__all__ = [
    "EndpointError",
    "EngineReading",
    "Exposition",
    "counters_reading",
    "excerpt",
    "missing_metrics",
    "read_spectune",
    "spec_decode_counters",
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


def missing_metrics(engine: str, what: str) -> EndpointError:
    """The error for an exposition that lacks what ``engine``'s dialect reads."""
    return EndpointError(f"the {engine} metrics hold no {what}")


def spec_decode_counters(ex: Exposition, prefix: str) -> tuple[SpecCounts, int | None] | None:
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


def counters_reading(engine: str, ex: Exposition, prefix: str, note: str) -> EngineReading | None:
    """``engine``'s reading of vLLM-style counters under ``prefix`` (``spec_decode_counters``),
    acceptance per position where it has one label per position; None when they are absent.
    ``note``: what the engine does not export."""
    found = spec_decode_counters(ex, prefix)
    if found is None:
        return None
    counts, k = found
    measured = frozenset({"per_position"} if k is not None else set())
    return EngineReading(engine, counts, measured, k=k, notes=(note,))


def read_spectune(ex: Exposition) -> EngineReading:
    p = "spectune_spec_decode_"
    steps = ex.total(f"{p}num_steps_total")
    if steps is None:
        raise missing_metrics("spectune", "spectune_spec_decode_num_steps_total")
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
