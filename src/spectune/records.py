"""What every stage shares about a decoding step: the K bounds, the stop hook, the step
record, and the counters (``SpecCounts``) that every rate is derived from.

These types sit on the ground floor so that the K policies (``spectune.control``), the
engines (``spectune.decode``), the monitor, the server and the exports can all name a step
without importing the loop that produces it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spectune.errors import InvalidParameterError

__all__ = [
    "MAX_K",
    "CountsReport",
    "DerivedRates",
    "SpecCounts",
    "StepRecord",
    "StopCondition",
    "ratio",
    "validate_k",
]

MAX_K = 32  # beyond this a chain draft is never accepted in full; larger K is a mistake


def validate_k(k: int, *, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if not isinstance(k, int) or isinstance(k, bool) or not low <= k <= MAX_K:
        raise InvalidParameterError(
            f"K (draft tokens per step) must be in [{low}, {MAX_K}], got {k}"
        )
    return k


class StopCondition(Protocol):
    def check(self, output: Sequence[int]) -> int | None:
        """If the output now contains a stop, the number of tokens to keep; else None."""
        ...


@dataclass(frozen=True)
class StepRecord:
    """What one step did. Rates are derived from these counts when reported."""

    index: int
    k: int  # draft tokens asked of the drafter (0: a plain decoding step)
    num_draft_tokens: int  # draft tokens the drafter returned (a chain: <= k; a tree: nodes)
    accepted: int  # draft tokens the target kept
    emitted: tuple[int, ...]  # tokens appended to the output, after stop truncation
    draft_time: float  # seconds spent drafting
    target_time: float  # seconds in the target's forward pass
    step_time: float  # wall seconds for the whole step (draft + target + verify + bookkeeping)
    fallback: str | None = None  # why speculation was off or cut short this step, if it was
    finish_reason: str | None = None  # "eos" | "length" | "stop" once the request is done
    verify_groups: int = 1  # target passes the verification took (chunked: > 1)
    tree_depth: int | None = None  # a tree draft's longest path; None for a chain
    # Peak memory of the verification pass (spectune.models.devices.VerifyMemory: the CUDA
    # allocator's peak above resident, or on the CPU the bytes of its tensors from shapes);
    # None where not measured (older traces, test doubles).
    verify_peak_bytes: int | None = None
    # A plain step's shadow guess (StepPlan.shadow): whether a model-free drafter's one-token
    # guess was the token the target emitted; None where no guess was made.
    shadow_hit: bool | None = None

    @property
    def positions(self) -> int:
        """Draft positions tested along one path: a chain's length, a tree's depth. The
        denominator of acceptance: a tree of 8 nodes and depth 2 can keep 2 tokens at
        most, so accepted / num_draft_tokens would understate how well it did."""
        return self.num_draft_tokens if self.tree_depth is None else self.tree_depth


def ratio(part: float, whole: float) -> float | None:
    """``part / whole``, or None where it is undefined (``whole`` is 0)."""
    return part / whole if whole > 0 else None


class DerivedRates:
    """The rates, each defined once, as ratios of counts a subclass holds: ``SpecCounts``
    (plain sums) and the monitor's moving averages (sums of decayed weights, floats)."""

    steps: float
    positions: float
    accepted: float
    emitted: float
    fallback_steps: float
    draft_time: float
    step_time: float

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens / draft positions tested."""
        return ratio(self.accepted, self.positions)

    @property
    def accepted_length(self) -> float | None:
        """Kept draft tokens plus the target's own, per step, before truncation."""
        return ratio(self.accepted + self.steps, self.steps)

    @property
    def tokens_per_step(self) -> float | None:
        """Output tokens per step (after truncation)."""
        return ratio(self.emitted, self.steps)

    @property
    def tokens_per_second(self) -> float | None:
        """Output tokens per second of step time (prefill excluded)."""
        return ratio(self.emitted, self.step_time)

    @property
    def draft_share(self) -> float | None:
        """Draft time / step time."""
        return ratio(self.draft_time, self.step_time)

    @property
    def fallback_frequency(self) -> float | None:
        """Steps run with a fallback reason / steps."""
        return ratio(self.fallback_steps, self.steps)


@dataclass
class SpecCounts(DerivedRates):
    """Counters over steps, and every rate derived from them (vLLM's rule: store counts,
    derive rates when reporting). Each report, the monitor, the server's usage, the
    selection runs, the experiments and the benchmark build on this one type.

    Two draft quantities, named apart:

    - ``num_draft_tokens``  tokens (a tree: nodes) the drafter returned,
                            ``StepRecord.num_draft_tokens``: the target's verification work.
    - ``positions``     draft positions tested along one path, ``StepRecord.positions`` (a
                        chain: its length; a tree: its depth): the most a step can keep, so
                        the denominator of acceptance.

    Two lengths per step, named apart:

    - ``accepted_length``  (accepted + steps) / steps: kept draft tokens plus the target's
                           own token (bonus or recovered), before any truncation at EOS,
                           ``max_tokens`` or a stop string.
    - ``tokens_per_step``  emitted / steps: tokens that reached the output. It differs from
                           ``accepted_length`` only by the final, truncated step.

    Rates are None where undefined (no steps, nothing tested, no time).
    """

    steps: int = 0
    num_draft_tokens: int = 0
    positions: int = 0
    accepted: int = 0  # draft tokens the target kept
    emitted: int = 0  # tokens appended to the output (after truncation)
    rejections: int = 0  # steps that kept fewer tokens than the positions they tested
    fallback_steps: int = 0  # steps run with a fallback reason
    draft_time: float = 0.0  # seconds
    target_time: float = 0.0  # seconds
    step_time: float = 0.0  # seconds (wall, whole steps)
    tested_at: list[int] = field(default_factory=list)  # [j]: steps that tested position j + 1
    accepted_at: list[int] = field(default_factory=list)  # [j]: steps that kept position j + 1

    @classmethod
    def of(cls, records: Iterable[StepRecord]) -> SpecCounts:
        counts = cls()
        for record in records:
            counts.add(record)
        return counts

    def add(self, record: StepRecord) -> None:
        """Count one step."""
        self.add_step(
            num_draft_tokens=record.num_draft_tokens,
            positions=record.positions,
            accepted=record.accepted,
            emitted=len(record.emitted),
            fallback=record.fallback is not None,
            draft_time=record.draft_time,
            target_time=record.target_time,
            step_time=record.step_time,
        )

    def add_step(
        self,
        *,
        num_draft_tokens: int,
        positions: int,
        accepted: int,
        emitted: int,
        fallback: bool = False,
        draft_time: float = 0.0,
        target_time: float = 0.0,
        step_time: float = 0.0,
    ) -> None:
        """Count one step from its numbers (for callers that keep numbers, not records)."""
        self.steps += 1
        self.num_draft_tokens += num_draft_tokens
        self.positions += positions
        self.accepted += accepted
        self.emitted += emitted
        self.rejections += accepted < positions
        self.fallback_steps += fallback
        self.draft_time += draft_time
        self.target_time += target_time
        self.step_time += step_time
        self.count_positions(positions, accepted)

    def count_positions(self, positions: int, accepted: int) -> None:
        """The per-position counters of one step that tested ``positions`` and kept the
        first ``accepted`` (``add_step`` calls it; alone, for callers that have per-step
        paths but only totals for the rest)."""
        if positions > len(self.tested_at):
            grow = positions - len(self.tested_at)
            self.tested_at += [0] * grow
            self.accepted_at += [0] * grow
        for j in range(positions):
            self.tested_at[j] += 1
            self.accepted_at[j] += j < accepted

    def merge(self, other: SpecCounts) -> None:
        """Add another set of counts to these (requests pooled into one total)."""
        self.steps += other.steps
        self.num_draft_tokens += other.num_draft_tokens
        self.positions += other.positions
        self.accepted += other.accepted
        self.emitted += other.emitted
        self.rejections += other.rejections
        self.fallback_steps += other.fallback_steps
        self.draft_time += other.draft_time
        self.target_time += other.target_time
        self.step_time += other.step_time
        grow = len(other.tested_at) - len(self.tested_at)
        if grow > 0:
            self.tested_at += [0] * grow
            self.accepted_at += [0] * grow
        for j, (tested, kept) in enumerate(zip(other.tested_at, other.accepted_at, strict=True)):
            self.tested_at[j] += tested
            self.accepted_at[j] += kept

    def since(self, earlier: SpecCounts) -> SpecCounts | None:
        """These counts less ``earlier`` ones, taken from the same counters before (a
        window between two scrapes); None where any counter went down (a restart)."""
        width = max(len(self.tested_at), len(earlier.tested_at))

        def pad(values: list[int]) -> list[int]:
            return values + [0] * (width - len(values))

        tested = [a - b for a, b in zip(pad(self.tested_at), pad(earlier.tested_at), strict=True)]
        kept = [a - b for a, b in zip(pad(self.accepted_at), pad(earlier.accepted_at), strict=True)]
        window = SpecCounts(
            steps=self.steps - earlier.steps,
            num_draft_tokens=self.num_draft_tokens - earlier.num_draft_tokens,
            positions=self.positions - earlier.positions,
            accepted=self.accepted - earlier.accepted,
            emitted=self.emitted - earlier.emitted,
            rejections=self.rejections - earlier.rejections,
            fallback_steps=self.fallback_steps - earlier.fallback_steps,
            draft_time=self.draft_time - earlier.draft_time,
            target_time=self.target_time - earlier.target_time,
            step_time=self.step_time - earlier.step_time,
            tested_at=tested,
            accepted_at=kept,
        )
        counts = (window.steps, window.num_draft_tokens, window.positions, window.accepted)
        rest = (window.emitted, window.rejections, window.fallback_steps, *tested, *kept)
        times = (window.draft_time, window.target_time, window.step_time)
        if min((*counts, *rest), default=0) < 0 or min(times) < -1e-9:
            return None
        return window

    def drop_emitted(self, tokens: int) -> None:
        """Take back ``tokens`` emitted tokens that a later cut removed from the output (a
        stop string found in the text after the step that completed it)."""
        if not 0 <= tokens <= self.emitted:
            raise ValueError(f"cannot drop {tokens} of {self.emitted} emitted tokens")
        self.emitted -= tokens

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        """[j]: steps that kept draft position j + 1 / steps that tested it."""
        return tuple(k / t for k, t in zip(self.accepted_at, self.tested_at, strict=True))


class CountsReport:
    """The names a report built on ``counts`` publishes, each read off its ``SpecCounts``
    (rates as 0 where undefined, as the reports always published them). ``Generation``,
    the server's usage, the selection runs, the tuning predictions and the experiments'
    totals share these; ``drafted`` is the draft tokens (a tree: its nodes) unless a report
    says otherwise."""

    counts: SpecCounts

    @property
    def drafted(self) -> int:
        return self.counts.num_draft_tokens

    @property
    def accepted(self) -> int:
        return self.counts.accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft positions tested (0 when none were)."""
        return self.counts.acceptance_rate or 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per step, the bonus or recovered token included
        (``SpecCounts.tokens_per_step``; 0 before the first step)."""
        return self.counts.tokens_per_step or 0.0

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per second of step time (0 before any)."""
        return self.counts.tokens_per_second or 0.0
