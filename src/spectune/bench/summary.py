"""From raw measurements to the numbers the tables show.

Glossary (per system, dtype, temperature and category; ``all`` pools every prompt):
- tokens/s            new tokens / wall seconds of the calls (prefill included), pooled
                      over the category's prompts per repetition; median, min and max
                      over repetitions.
- speedup             median tokens/s over that of spectune plain decoding (x plain) and of
                      transformers' generate() (x HF), same dtype, temperature, category.
- acceptance rate     accepted / drafted draft tokens (a token tree counts its depth:
                      the most one step can keep, ``StepRecord.positions``).
- by position         acceptance at draft position j (1-based): steps whose j-th draft token
                      was kept / steps that tested a j-th position (vLLM's per-position
                      counters); position 1 is the first-token acceptance.
- accepted length     new tokens per target forward (accepted tokens plus the target's own).
- draft share         drafting time / decode time (spectune) or / call time (transformers).
- fallback rate       steps with a fallback reason / steps (spectune).
- greedy equality     at T = 0, calls whose output equals spectune plain decoding's greedy
                      output token for token; transformers systems are also compared with
                      transformers' own greedy output (its numerics may differ from ours).
- predicted speedup   the analytic model of ``spectune.control.costs`` applied to the steps taken:
                      sum over steps of E[tokens | d] / sum of (d c + v(d)), d = tokens the
                      step drafted (<= K), with the measured acceptance alpha, draft cost c
                      (draft seconds per drafted token over the target's one-token forward)
                      and curve v; steps without a draft count 1 / 1.
- efficiency          measured decode speedup (decode tokens/s over plain's) / predicted.
                      Chains only: for token trees (which verify nodes, not K tokens) the
                      bound is left empty.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from spectune.bench.runner import Measurement
from spectune.bench.systems import SystemInfo
from spectune.control.costs import CostCurve, expected_tokens_per_step
from spectune.records import SpecCounts

__all__ = ["ALL", "Equality", "Mismatch", "Row", "find_mismatches", "summarize"]

ALL = "all"
PLAIN = "spectune plain"
HF_PLAIN = "HF generate"


@dataclass(frozen=True)
class Row:
    system: str
    family: str
    drafter: str | None
    k: int | None
    policy: str | None
    dtype: str
    temperature: float
    category: str
    calls: int
    new_tokens: int
    tokens_per_second: float  # median over repetitions
    tps_min: float
    tps_max: float
    speedup_vs_plain: float | None
    speedup_vs_hf: float | None
    acceptance_rate: float | None
    acceptance_by_position: tuple[float, ...]  # [j - 1]: acceptance at draft position j
    mean_accepted_length: float
    draft_share: float | None
    fallback_rate: float | None
    mean_k: float | None
    greedy_compared: int  # calls compared with spectune's greedy reference (T = 0 only)
    greedy_equal: int
    hf_greedy_compared: int  # transformers systems: compared with transformers' greedy
    hf_greedy_equal: int
    alpha: float | None  # the acceptance the analytic bound uses
    draft_cost: float | None  # c
    predicted_speedup: float | None
    efficiency: float | None


@dataclass(frozen=True)
class Mismatch:
    """A greedy output that differs from its reference: never hidden, always listed."""

    system: str
    dtype: str
    prompt_id: str
    repeat: int
    reference: str  # "spectune plain" or "HF generate"
    first_difference: int  # index of the first differing token (or the shorter length)
    expected: int | None  # reference token there (None: the reference ended)
    got: int | None
    expected_length: int
    got_length: int


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _references(
    measurements: Sequence[Measurement], system: str
) -> dict[tuple[str, str], tuple[int, ...]]:
    """Greedy output of ``system`` per (dtype, prompt), from its first repetition."""
    refs: dict[tuple[str, str], tuple[int, ...]] = {}
    for m in measurements:
        if m.system == system and m.temperature == 0.0 and m.repeat == 0:
            refs[(m.dtype, m.prompt_id)] = m.result.tokens
    return refs


@dataclass(frozen=True)
class Equality:
    """Per measurement index: does the greedy output equal each reference?"""

    spectune: dict[int, bool]  # vs spectune plain decoding (every system)
    hf: dict[int, bool]  # vs transformers' generate() (transformers systems only)
    mismatches: list[Mismatch]


def find_mismatches(measurements: Sequence[Measurement], families: dict[str, str]) -> Equality:
    """Compare every greedy call with its references (first repetition of the reference)."""
    references = {
        PLAIN: _references(measurements, PLAIN),
        HF_PLAIN: _references(measurements, HF_PLAIN),
    }
    result = Equality({}, {}, [])
    for index, m in enumerate(measurements):
        if m.temperature != 0.0:
            continue
        checks = [(PLAIN, result.spectune)]
        if families[m.system].startswith("hf"):
            checks.append((HF_PLAIN, result.hf))
        for reference, verdicts in checks:
            expected = references[reference].get((m.dtype, m.prompt_id))
            if expected is None:
                continue
            got = m.result.tokens
            where = _first_difference(expected, got)
            verdicts[index] = where is None
            if where is not None:
                result.mismatches.append(
                    Mismatch(
                        system=m.system,
                        dtype=m.dtype,
                        prompt_id=m.prompt_id,
                        repeat=m.repeat,
                        reference=reference,
                        first_difference=where,
                        expected=expected[where] if where < len(expected) else None,
                        got=got[where] if where < len(got) else None,
                        expected_length=len(expected),
                        got_length=len(got),
                    )
                )
    return result


def _tps_over_repeats(group: Sequence[Measurement]) -> list[float]:
    by_repeat: dict[int, list[Measurement]] = defaultdict(list)
    for m in group:
        by_repeat[m.repeat].append(m)
    rates = []
    for repeat in sorted(by_repeat):
        calls = by_repeat[repeat]
        seconds = sum(m.result.seconds for m in calls)
        rates.append(sum(len(m.result.tokens) for m in calls) / seconds if seconds > 0 else 0.0)
    return rates


def _decode_tps(group: Sequence[Measurement]) -> float | None:
    seconds = [m.result.decode_seconds for m in group]
    if any(s is None for s in seconds):
        return None
    total = sum(s for s in seconds if s is not None)
    return sum(len(m.result.tokens) for m in group) / total if total > 0 else None


def _counts(group: Sequence[Measurement]) -> SpecCounts:
    """The group's counters: totals per call (what every system reports) and, where a
    spectune system recorded its steps, the per-position counts (module glossary)."""
    counts = SpecCounts()
    for m in group:
        r = m.result
        one = SpecCounts(
            steps=r.target_calls,
            positions=r.drafted or 0,
            accepted=r.accepted or 0,
            emitted=len(r.tokens),
            fallback_steps=r.fallback_steps,
            draft_time=r.draft_seconds or 0.0,
            step_time=r.decode_seconds or r.seconds,
        )
        for positions, accepted in zip(r.step_positions, r.step_accepted, strict=True):
            one.count_positions(positions, accepted)
        counts.merge(one)
    return counts


def _bound(
    group: Sequence[Measurement], curve: CostCurve | None
) -> tuple[float | None, float | None, float | None]:
    """(alpha, c, predicted speedup) for a spectune speculative group, else Nones."""
    counts = _counts(group)
    drafted = counts.positions
    # What each step verified: a drafter may return fewer tokens than K (n-gram misses).
    sizes = [d for m in group for d in m.result.step_drafted]
    if curve is None or not sizes or any(m.result.drafted is None for m in group):
        return None, None, None
    alpha = counts.acceptance_rate or 0.0
    cost = (counts.draft_time / drafted) / curve.seconds[0] if drafted else 0.0
    tokens = sum(expected_tokens_per_step(alpha, d) for d in sizes)
    time_units = sum(d * cost + curve.relative(d) for d in sizes)
    return alpha, cost, tokens / time_units


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


Key = tuple[str, float, str, str]  # (dtype, temperature, category, system)


def _row(
    key: Key,
    items: Sequence[tuple[int, Measurement]],
    info: SystemInfo,
    medians: dict[Key, float],
    decode_rates: dict[Key, float | None],
    equality: Equality,
    curve: CostCurve | None,
) -> Row:
    """One table row: a system's calls in one dtype, temperature and category."""
    dtype, temperature, category, name = key
    group = [m for _, m in items]
    rates = _tps_over_repeats(group)
    counts = _counts(group)
    ks = [k for m in group for k in m.result.ks]
    speculative = info.family not in ("spectune-plain", "hf-generate", "llamacpp-plain")
    alpha, cost, predicted = (
        # The chain model does not describe a tree (it verifies nodes, not K tokens).
        _bound(group, curve)
        if info.family == "spectune" and info.tree is None
        else (None, None, None)
    )
    plain_key = (dtype, temperature, category, PLAIN)
    measured_decode = _ratio(decode_rates[key], decode_rates.get(plain_key))
    compared = [equality.spectune[i] for i, _ in items if i in equality.spectune]
    hf_compared = [equality.hf[i] for i, _ in items if i in equality.hf]
    return Row(
        system=name,
        family=info.family,
        drafter=info.drafter,
        k=info.k,
        policy=info.policy,
        dtype=dtype,
        temperature=temperature,
        category=category,
        calls=len(group),
        new_tokens=counts.emitted,
        tokens_per_second=medians[key],
        tps_min=min(rates),
        tps_max=max(rates),
        speedup_vs_plain=_ratio(medians[key], medians.get(plain_key)),
        speedup_vs_hf=_ratio(medians[key], medians.get((dtype, temperature, category, HF_PLAIN))),
        acceptance_rate=(
            counts.acceptance_rate
            if speculative and all(m.result.drafted is not None for m in group)
            else None
        ),
        acceptance_by_position=counts.acceptance_by_position if speculative else (),
        mean_accepted_length=counts.tokens_per_step or 0.0,
        draft_share=(
            counts.draft_share if all(m.result.draft_seconds is not None for m in group) else None
        ),
        # A spectune call records one K per step: the fallback frequency over its steps.
        fallback_rate=counts.fallback_frequency if info.family == "spectune" and ks else None,
        mean_k=statistics.fmean(ks) if info.family == "spectune" and ks else None,
        greedy_compared=len(compared),
        greedy_equal=sum(compared),
        hf_greedy_compared=len(hf_compared),
        hf_greedy_equal=sum(hf_compared),
        alpha=alpha,
        draft_cost=cost,
        predicted_speedup=predicted,
        efficiency=_ratio(measured_decode, predicted),
    )


def summarize(
    measurements: Sequence[Measurement],
    systems: Sequence[SystemInfo],
    curves: dict[str, CostCurve],  # spectune runtime's curve per dtype
) -> tuple[list[Row], list[Mismatch]]:
    infos = {s.name: s for s in systems}
    equality = find_mismatches(measurements, {s.name: s.family for s in systems})
    groups: dict[Key, list[tuple[int, Measurement]]] = defaultdict(list)
    for index, m in enumerate(measurements):
        for category in (m.category, ALL):
            groups[(m.dtype, m.temperature, category, m.system)].append((index, m))

    medians: dict[Key, float] = {}
    decode_rates: dict[Key, float | None] = {}
    for key, items in groups.items():
        group = [m for _, m in items]
        medians[key] = statistics.median(_tps_over_repeats(group))
        decode_rates[key] = _decode_tps(group)

    rows = [
        _row(key, items, infos[key[3]], medians, decode_rates, equality, curves.get(key[0]))
        for key, items in groups.items()
    ]
    order = {s.name: i for i, s in enumerate(systems)}
    rows.sort(
        key=lambda r: (r.dtype, r.temperature, r.category != ALL, r.category, order[r.system])
    )
    return rows, equality.mismatches
