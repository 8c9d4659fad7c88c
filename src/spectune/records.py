"""What every stage shares about a decoding step: the K bounds, the stop hook, the step record.

These types sit on the ground floor so that the K policies (``spectune.control``), the
engines (``spectune.decode``), the monitor, the server and the exports can all name a step
without importing the loop that produces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from spectune.errors import InvalidParameterError

__all__ = ["MAX_K", "StepRecord", "StopCondition", "drafter_error", "validate_k"]

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
    drafted: int  # draft tokens the drafter returned (<= k)
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

    @property
    def positions(self) -> int:
        """Draft positions tested along one path: a chain's length, a tree's depth. The
        denominator of acceptance: a tree of 8 nodes and depth 2 can keep 2 tokens at
        most, so accepted / drafted would understate how well it did."""
        return self.drafted if self.tree_depth is None else self.tree_depth


def drafter_error(exc: BaseException) -> str:
    """The fallback reason a drafter's exception becomes: ``drafter_error: <message>``,
    its first line only, at most 200 characters (it goes into every later record)."""
    return f"drafter_error: {exc}".splitlines()[0][:200]
