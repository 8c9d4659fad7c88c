"""From measured speedups to a batch-size schedule and a cost profile: the arithmetic of
``spectune tune --engine vllm``, apart from any server.

Glossary:

- level         a tested concurrency: that many clients send the batch of requests, so
                vLLM's batch holds up to that many requests (fewer as they finish).
- ratio         tokens/s of a configuration over off's on the same requests in the same
                round; ``Ratio`` is its mean over rounds with the standard error of that
                mean (None with one round: no noise estimate).
- beyond noise  ``mean - z * se > 1`` (a gain) or ``mean + z * se < 1`` (a loss); ``z``
                is ``--noise-z`` (2 by default). Without a standard error a gain is never
                beyond the noise (unless z = 0) and any ratio under 1 is a loss.
- schedule      vLLM's ``num_speculative_tokens_per_batch_size``: inclusive batch-size
                ranges ``[start, end, K]``, the first starting at 1, none overlapping
                (vLLM 0.32, ``vllm/v1/spec_decode/dynamic/utils.py``). vLLM clamps each K
                to ``num_speculative_tokens`` and carries the last range's K on to its
                largest batch.

The policy (``build_schedule``, ``guard``): a level gets the K that measured best there,
and 0 unless it beat off beyond the noise; batch sizes between two tested levels get the
smaller of their two Ks, and batch sizes above the largest tested level get 0 (not
measured). A schedule whose confirmation measured it slower than off at a level where it
drafted nothing (the speculative path itself costs) is not recommended at all.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spectune.engines.costs import StepCosts

__all__ = [
    "MAX_BATCH",
    "CostPoint",
    "Guarded",
    "Ratio",
    "beats_off",
    "build_schedule",
    "fit_costs",
    "guard",
    "one_k_ranges",
    "pick_k",
    "ratio",
    "schedule_ranges",
    "slower_than_off",
]

MAX_BATCH = 1024  # the end of the last range; vLLM clamps it to its max_num_seqs

Range = tuple[int, int, int]  # (first batch size, last batch size, K), inclusive


@dataclass(frozen=True)
class Ratio:
    """A speedup over off at one level: the mean over rounds and its standard error."""

    mean: float
    se: float | None  # None with one round
    rounds: int

    def text(self) -> str:
        return f"{self.mean:.2f}x" + ("" if self.se is None else f" ±{self.se:.2f}")


def ratio(rates: Sequence[float], off_rates: Sequence[float]) -> Ratio:
    """The per-round ratios ``rates[r] / off_rates[r]`` as a mean and its standard error."""
    if len(rates) != len(off_rates) or not rates:
        raise ValueError("one rate per round for each, at least one round")
    ratios = [rate / off for rate, off in zip(rates, off_rates, strict=True)]
    se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else None
    return Ratio(statistics.fmean(ratios), se, len(ratios))


def beats_off(r: Ratio, z: float) -> bool:
    """A gain beyond the noise: ``mean - z * se > 1``."""
    if r.se is None:
        return z == 0 and r.mean > 1
    return r.mean - z * r.se > 1


def slower_than_off(r: Ratio, z: float) -> bool:
    """A loss beyond the noise: ``mean + z * se < 1`` (with one round: ``mean < 1``)."""
    return r.mean + z * (r.se or 0.0) < 1


def pick_k(ratios_by_k: Mapping[int, Ratio], z: float) -> int:
    """The K whose ratio is best among those that beat off beyond the noise; 0 if none
    does. On a tie the smaller K (it costs less where the draft misses)."""
    beating = [(r.mean, -k, k) for k, r in ratios_by_k.items() if k > 0 and beats_off(r, z)]
    return max(beating)[2] if beating else 0


def schedule_ranges(k_at: Mapping[int, int]) -> list[Range]:
    """vLLM's ranges from a K per tested level. Level ``c`` gets its own range ``[c, c]``;
    sizes strictly between two levels the smaller K of the two; sizes below the smallest
    level or above the largest, 0. Neighbouring ranges with one K are merged."""
    if not k_at or min(k_at) < 1 or max(k_at) >= MAX_BATCH or min(k_at.values()) < 0:
        raise ValueError(f"levels must be in 1..{MAX_BATCH - 1}, K >= 0")
    levels = sorted(k_at)
    ranges: list[Range] = []
    if levels[0] > 1:
        ranges.append((1, levels[0] - 1, 0))
    for i, level in enumerate(levels):
        ranges.append((level, level, k_at[level]))
        if i + 1 < len(levels) and levels[i + 1] > level + 1:
            between = min(k_at[level], k_at[levels[i + 1]])
            ranges.append((level + 1, levels[i + 1] - 1, between))
    ranges.append((levels[-1] + 1, MAX_BATCH, 0))
    merged: list[Range] = []
    for start, end, k in ranges:
        if merged and merged[-1][2] == k:
            merged[-1] = (merged[-1][0], end, k)
        else:
            merged.append((start, end, k))
    return merged


def build_schedule(
    by_level: Mapping[int, Mapping[int, Ratio]], z: float, *, one_k: bool = False
) -> tuple[dict[int, int], list[Range]]:
    """``by_level[c][K]``: one family's ratio at level c with K. The K per level
    (``pick_k``) and vLLM's ranges for it.

    ``one_k``: the method takes no batch-size schedule (``ONE_K_METHODS``: vLLM 0.32's
    suffix proposer asserts that every step's K equals ``num_speculative_tokens``, so a
    range of another K, 0 included, kills the engine once a batch falls in it). Every
    level then gets the one K whose ratios, over all levels, have the highest geometric
    mean, if that mean beats off; else 0 everywhere."""
    if not one_k:
        k_at = {level: pick_k(ratios, z) for level, ratios in by_level.items()}
        return k_at, schedule_ranges(k_at)
    best: tuple[float, int] = (1.0, 0)
    for k in sorted({k for ratios in by_level.values() for k in ratios if k > 0}):
        if not all(k in ratios for ratios in by_level.values()):
            continue
        score = math.exp(statistics.fmean(math.log(r[k].mean) for r in by_level.values()))
        if score > best[0]:
            best = (score, k)
    k_at = {level: best[1] for level in by_level}
    return k_at, one_k_ranges(best[1])


def one_k_ranges(k: int) -> list[Range]:
    """One K at every batch size (a method without schedules, written as one range)."""
    return [(1, MAX_BATCH, k)]


@dataclass(frozen=True)
class Guarded:
    """A confirmed schedule after the guard."""

    k_at: dict[int, int]  # K per level; all 0: keep speculation off
    ranges: list[Range] | None  # None: keep speculation off
    dropped: tuple[int, ...]  # levels whose K was set to 0 (no gain beyond the noise)
    reason: str | None  # why speculation stays off, when it does


def guard(
    k_at: Mapping[int, int], confirmed: Mapping[int, Ratio], z: float, *, one_k: bool = False
) -> Guarded:
    """The schedule to recommend, from the one confirmed (``k_at``, run as a schedule) and
    its ratio to off at each level: a level keeps its K only where the schedule beat off
    beyond the noise there; where it drafted nothing and still lost to off beyond the
    noise, the speculative path itself costs, and speculation stays off. A ``one_k``
    method cannot drop a level: it stays on only where it lost to off beyond the noise at
    no level and beat it beyond the noise at one at least."""
    if one_k:
        k = max(k_at.values(), default=0)
        losing = [level for level, r in sorted(confirmed.items()) if slower_than_off(r, z)]
        if k and losing:
            r = confirmed[losing[0]]
            reason = (
                f"at concurrency {losing[0]} it measured {r.text()} of off, and this method "
                "drafts at one K at every batch size (vLLM takes no schedule for it)"
            )
            return Guarded({c: 0 for c in k_at}, None, (), reason)
        if not k or not any(beats_off(r, z) for r in confirmed.values()):
            return Guarded({c: 0 for c in k_at}, None, (), "no level gained beyond the noise")
        return Guarded(dict(k_at), one_k_ranges(k), (), None)
    final = dict(k_at)
    dropped = []
    for level, k in sorted(k_at.items()):
        r = confirmed[level]
        if k == 0 and slower_than_off(r, z):
            reason = (
                f"at concurrency {level} the schedule drafted nothing and still measured "
                f"{r.text()} of off: vLLM's speculative path costs there"
            )
            return Guarded({c: 0 for c in k_at}, None, (), reason)
        if k > 0 and not beats_off(r, z):
            final[level] = 0
            dropped.append(level)
    if not any(final.values()):
        return Guarded(final, None, tuple(dropped), "no level gained beyond the noise")
    return Guarded(final, schedule_ranges(final), tuple(dropped), None)


@dataclass(frozen=True)
class CostPoint:
    """One configuration's requests at concurrency 1, read from vLLM's counters."""

    tokens: int  # output tokens
    seconds: float  # wall time of the batch
    drafts: int  # steps that drafted (vLLM's spec_decode_num_drafts)
    draft_tokens: int
    accepted: int


def fit_costs(plain_seconds: float, points: Sequence[CostPoint], max_k: int) -> StepCosts | None:
    """The verification cost v(K) in plain steps, fitted to configurations measured one
    request at a time: a request takes ``tokens - accepted`` steps, of which ``drafts``
    verified a draft (``draft_tokens / drafts`` tokens on average) and the rest cost one
    plain step (``plain_seconds``, off's time per token); so a drafting step costs
    ``v = (seconds - (steps - drafts) * plain) / (drafts * plain)`` plain steps, drafting
    included. v(K) = 1 + slope * K is fitted through (mean draft length, v), weighted by
    drafts, up to ``max_k`` (the longest draft measured). None without any draft.
    ``draft_cost`` is 0: the drafter's own time is inside v."""
    xs: list[tuple[float, float, int]] = []
    for p in points:
        steps = p.tokens - p.accepted
        if p.drafts <= 0 or steps < p.drafts or plain_seconds <= 0:
            continue
        v = (p.seconds - (steps - p.drafts) * plain_seconds) / (p.drafts * plain_seconds)
        xs.append((p.draft_tokens / p.drafts, v, p.drafts))
    if not xs or max_k < 1:
        return None
    slope = sum(w * (v - 1) * x for x, v, w in xs) / sum(w * x * x for x, _, w in xs)
    slope = max(slope, 0.0)  # verifying more never costs less than verifying nothing
    verify = tuple(1 + slope * k for k in range(max_k + 1))
    return StepCosts(0.0, verify, "tune --engine vllm", "vllm")
