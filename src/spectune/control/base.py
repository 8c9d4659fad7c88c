"""The K-policy contract: how many tokens to draft next, learned from what happened.

Policies own their state (one instance per request) and never touch models or configs.
``next_k() == 0`` means "no speculation this step" (plain decoding).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from spectune.engine import StepRecord

__all__ = ["FixedK", "KPolicy"]


@runtime_checkable
class KPolicy(Protocol):
    def next_k(self) -> int:
        """Draft tokens to propose in the next step (0 = decode without a draft)."""
        ...

    def observe(self, record: StepRecord) -> None:
        """Learn from the step that just ran."""
        ...

    @property
    def reason(self) -> str | None:
        """Why the policy currently holds speculation off, or None."""
        ...


class FixedK:
    """Always the same K: the baseline every adaptive policy is compared with."""

    def __init__(self, k: int) -> None:
        from spectune.engine import validate_k

        self.k = validate_k(k, allow_zero=True)

    def next_k(self) -> int:
        return self.k

    def observe(self, record: StepRecord) -> None:
        """Fixed: nothing to learn."""

    @property
    def reason(self) -> str | None:
        return None
