"""What recorded steps say about a workload: per-token outcomes, per-position acceptance and
this machine's step costs. ``spectune.control.tune`` replays candidate policies over it.

Glossary (one request = the steps one recorded generation took, in order):
- outcome of output token p   whether a draft token proposed for output position p is
                              accepted, given that every draft token before it was. With a
                              drafter that is a function of the context (greedy model
                              drafts, n-grams, suffix drafts) this depends on p only, not
                              on where the draft began: a draft that began earlier reached
                              p through accepted tokens, i.e. through the same context. A
                              recorded chain step at position p that drafted d tokens and
                              kept a tells p .. p + a - 1 accepted and, when a < d, p + a
                              rejected. Positions no step tested (plain steps, a bonus
                              token after a fully accepted draft) are unknown.
- draft length at p           how many tokens the drafter offers at p (an n-gram drafter
                              offers none without a match): exact where a step asked for
                              more than it got, otherwise unlimited.
- per-position acceptance     c_i, the probability that draft token i is accepted given
                              that tokens 1 .. i - 1 were, over every recorded chain step
                              (shrunk towards the pooled rate where few steps reached i).
                              An unknown outcome at draft position i is drawn with
                              probability c_i x (the local rate around p / the pooled
                              rate): the local rate (known outcomes within
                              ``LOCAL_WINDOW`` tokens) keeps hard stretches hard.
- draws                       one uniform number per output position, fixed by a seed, so
                              every candidate policy meets the same luck (common random
                              numbers: differences between candidates are the policies').

Sampled requests (temperature > 0) are replayed the same way: their recorded outcomes are one
draw of the acceptance test. Tree steps are not used (a tree's accepted branch says nothing
about a chain's token at the same position); a trace with no chain draft steps is refused.

Costs, in seconds: the target's verification curve (measured with
``spectune.control.costs.measure_forward_curve``, or fitted from the recorded target times through
``LearnedCurve``), the draft time as a line ``fixed + per_token x drafted`` (least squares
over steps that asked for a draft), and the step overhead (median step time minus draft and
target time), for plain and speculative steps apart.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from spectune.control.cost import LearnedCurve
from spectune.control.costs import CostCurve
from spectune.errors import InvalidParameterError
from spectune.records import MAX_K, StepRecord

__all__ = [
    "LOCAL_WINDOW",
    "RecordedRequest",
    "StepCosts",
    "Timeline",
    "Workload",
    "fit_costs",
    "fit_workload",
]

LOCAL_WINDOW = 32  # tokens each side of a position whose known outcomes give the local rate
MIN_LOCAL = 4  # known outcomes needed before the local rate is used
SHRINK = 2.0  # pseudo-steps pulling c_i towards the pooled rate


@dataclass(frozen=True)
class RecordedRequest:
    """One recorded generation: its sampling temperature and its steps, in order."""

    temperature: float
    steps: tuple[StepRecord, ...]


@dataclass(frozen=True)
class Timeline:
    """One request's output positions, with what the recording says about each."""

    temperature: float
    known: tuple[bool | None, ...]  # [tokens]: the outcome at p, None where untested
    draft_length: tuple[int | None, ...]  # [tokens]: exact draft length at p, None: unlimited
    local_factor: tuple[float, ...]  # [tokens]: local rate / pooled rate around p
    draws: tuple[float, ...]  # [tokens]: uniform numbers for unknown outcomes

    @property
    def tokens(self) -> int:
        return len(self.known)

    def offered(self, start: int, k: int) -> int:
        """Draft tokens the drafter hands back at ``start`` when asked for k."""
        limit = self.draft_length[start] if start < len(self.draft_length) else None
        return k if limit is None else min(k, limit)

    def accepted_run(self, start: int, k: int, position_acceptance: Sequence[float]) -> int:
        """Draft tokens a k-token draft at ``start`` would get accepted (in a row)."""
        for i in range(k):
            p = start + i
            if p >= len(self.known):
                return i
            outcome = self.known[p]
            if outcome is None:
                c = position_acceptance[min(i, len(position_acceptance) - 1)]
                outcome = self.draws[p] < min(1.0, c * self.local_factor[p])
            if not outcome:
                return i
        return k


@dataclass(frozen=True)
class Workload:
    """Every recorded request as a ``Timeline``, and the per-position acceptance c_i."""

    timelines: tuple[Timeline, ...]
    position_acceptance: tuple[float, ...]  # [MAX_K]: c_i for draft positions 1 .. MAX_K
    pooled_rate: float  # accepted outcomes / known outcomes
    known_fraction: float  # output positions whose outcome the recording tells
    tree_steps: int  # tree steps left out

    @property
    def temperatures(self) -> tuple[float, ...]:
        return tuple(sorted({t.temperature for t in self.timelines}))


def _outcomes(request: RecordedRequest) -> tuple[list[bool | None], list[int | None], int]:
    tokens = sum(len(s.emitted) for s in request.steps)
    known: list[bool | None] = [None] * tokens
    lengths: list[int | None] = [None] * tokens
    trees = 0
    position = 0
    for step in request.steps:
        if step.tree_depth is not None:
            trees += 1
        elif step.k > 0 and position < tokens:
            if step.num_draft_tokens < step.k:
                lengths[position] = step.num_draft_tokens
            for i in range(min(step.accepted, tokens - position)):
                known[position + i] = True
            if step.accepted < step.num_draft_tokens and position + step.accepted < tokens:
                known[position + step.accepted] = False
        position += len(step.emitted)
    return known, lengths, trees


def _position_acceptance(requests: Sequence[RecordedRequest]) -> tuple[tuple[float, ...], float]:
    reached = [0] * MAX_K
    accepted = [0] * MAX_K
    for request in requests:
        for step in request.steps:
            if step.tree_depth is not None or step.num_draft_tokens == 0:
                continue
            for i in range(min(step.num_draft_tokens, step.accepted + 1, MAX_K)):
                reached[i] += 1
                accepted[i] += i < step.accepted
    if not reached[0]:
        raise InvalidParameterError(
            "the traces hold no chain draft steps (K > 0 with a draft): nothing to learn "
            "acceptance from; record with a drafter and a chain policy"
        )
    pooled = sum(accepted) / sum(reached)
    rates = []
    last = pooled
    for i in range(MAX_K):
        if reached[i]:
            last = (accepted[i] + SHRINK * pooled) / (reached[i] + SHRINK)
        rates.append(last)  # past the deepest position reached: the last estimate
    return tuple(rates), pooled


def _local_factors(known: Sequence[bool | None], pooled: float, fallback: float) -> list[float]:
    """Local rate / pooled rate at each position (sliding window of known outcomes)."""
    n = len(known)
    ones = [0] * (n + 1)
    seen = [0] * (n + 1)
    for p, outcome in enumerate(known):
        ones[p + 1] = ones[p] + (outcome is True)
        seen[p + 1] = seen[p] + (outcome is not None)
    factors = []
    for p in range(n):
        lo, hi = max(0, p - LOCAL_WINDOW), min(n, p + LOCAL_WINDOW + 1)
        count = seen[hi] - seen[lo]
        rate = (ones[hi] - ones[lo]) / count if count >= MIN_LOCAL else fallback
        factors.append(rate / pooled if pooled > 0 else 0.0)
    return factors


def fit_workload(requests: Sequence[RecordedRequest], *, seed: int = 0) -> Workload:
    """The workload model of ``requests`` (see the module docstring); ``seed`` fixes the draws."""
    requests = [r for r in requests if r.steps]
    if not requests:
        raise InvalidParameterError("the traces hold no steps")
    rates, pooled = _position_acceptance(requests)
    timelines = []
    trees = known_count = total = 0
    for index, request in enumerate(requests):
        known, lengths, tree_steps = _outcomes(request)
        trees += tree_steps
        values = [o for o in known if o is not None]
        known_count += len(values)
        total += len(known)
        own = sum(values) / len(values) if len(values) >= MIN_LOCAL else pooled
        draws = random.Random(seed * 1_000_003 + index)
        timelines.append(
            Timeline(
                temperature=request.temperature,
                known=tuple(known),
                draft_length=tuple(lengths),
                local_factor=tuple(_local_factors(known, pooled, own)),
                draws=tuple(draws.random() for _ in known),
            )
        )
    return Workload(
        timelines=tuple(timelines),
        position_acceptance=rates,
        pooled_rate=pooled,
        known_fraction=known_count / total if total else 0.0,
        tree_steps=trees,
    )


@dataclass(frozen=True)
class StepCosts:
    """Seconds a step costs on this machine, by the number of tokens it drafts."""

    verify: CostCurve  # seconds of a target forward over n tokens (n = drafted + 1)
    draft_fixed: float  # seconds per step that asks for a draft, whatever its length
    draft_per_token: float  # seconds per drafted token
    overhead_plain: float  # seconds of bookkeeping in a plain step
    overhead_speculative: float  # ... in a step that asked for a draft
    source: str  # "measured" (a forward curve) or "trace" (fitted from target times)
    sizes_seen: int = 0  # chunk sizes the trace's target times covered ("trace" only)

    def step(self, k: int, drafted: int) -> tuple[float, float, float]:
        """(draft, target, overhead) seconds of a step asking for k and getting ``drafted``."""
        if k == 0:
            return 0.0, self.verify.time(1), self.overhead_plain
        draft = self.draft_fixed + self.draft_per_token * drafted
        return draft, self.verify.time(drafted + 1), self.overhead_speculative

    @property
    def plain_tokens_per_second(self) -> float:
        return 1.0 / (self.verify.time(1) + self.overhead_plain)


def fit_costs(requests: Sequence[RecordedRequest], curve: CostCurve | None = None) -> StepCosts:
    """Step costs from recorded times; ``curve`` (measured) replaces the fitted target curve."""
    steps = [s for r in requests for s in r.steps if s.tree_depth is None]
    if not steps:
        raise InvalidParameterError("the traces hold no chain steps to measure costs from")
    source, sizes_seen = "measured", 0
    if curve is None:
        by_size: dict[int, list[float]] = {}
        for s in steps:
            if s.verify_groups == 1 and s.target_time > 0:
                by_size.setdefault(s.num_draft_tokens + 1, []).append(s.target_time)
        if not by_size:
            raise InvalidParameterError("the traces record no target times")
        learned = LearnedCurve(smoothing=1.0, slope_prior=0.05)
        for size, times in sorted(by_size.items()):
            learned.observe(size, statistics.median(times))
        fitted = learned.curve(MAX_K + 1)
        assert fitted is not None  # at least one size observed
        curve, source, sizes_seen = fitted, "trace", len(by_size)
    asked = [s for s in steps if s.k > 0]
    fixed, per_token = _draft_line(asked)
    plain = [s.step_time - s.draft_time - s.target_time for s in steps if s.k == 0]
    spec = [s.step_time - s.draft_time - s.target_time for s in asked]
    over_spec = max(0.0, statistics.median(spec)) if spec else 0.0
    over_plain = max(0.0, statistics.median(plain)) if plain else over_spec
    return StepCosts(curve, fixed, per_token, over_plain, over_spec, source, sizes_seen)


def _draft_line(steps: Sequence[StepRecord]) -> tuple[float, float]:
    """Least-squares ``draft_time = fixed + per_token x drafted`` (both >= 0)."""
    if not steps:
        return 0.0, 0.0
    xs = [float(s.num_draft_tokens) for s in steps]
    ys = [s.draft_time for s in steps]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0.0:  # one draft length seen: all of it per token
        return 0.0, (mean_y / mean_x if mean_x > 0 else 0.0)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    slope = max(0.0, slope)
    return max(0.0, mean_y - slope * mean_x), slope
