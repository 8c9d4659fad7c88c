"""The K-policy contract: how many tokens to draft next, learned from what happened.

Policies own their state (one instance per request) and never touch models or configs.
``next_k() == 0`` means "no speculation this step" (plain decoding).
"""

from __future__ import annotations

from typing import Protocol, TypeAlias, runtime_checkable

from spectune.records import StepRecord, validate_k

__all__ = ["FixedK", "GroupedVerification", "KPolicy", "PolicyState", "ReportsState"]

# A policy's inner state as flat JSON-ready values, for the step trace and the report.
PolicyState: TypeAlias = dict[str, float | int | str | bool | None]


@runtime_checkable
class KPolicy(Protocol):
    """Chooses K for the next step and learns from each step's record."""

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


@runtime_checkable
class ReportsState(Protocol):
    """Optional: a policy that can show its state (the trace records it after each step)."""

    def state(self) -> PolicyState:
        """Flat, JSON-ready values; reading them never changes the policy."""
        ...


@runtime_checkable
class GroupedVerification(Protocol):
    """A K policy that also chooses how many groups verification runs in (1: one pass;
    None: no preference, the engine's ``verify_groups`` setting applies)."""

    def verify_groups(self, k: int) -> int | None: ...


class FixedK:
    """Always the same K: the baseline every adaptive policy is compared with."""

    def __init__(self, k: int) -> None:
        self.k = validate_k(k, allow_zero=True)

    def next_k(self) -> int:
        return self.k

    def observe(self, record: StepRecord) -> None:
        """Fixed: nothing to learn."""

    @property
    def reason(self) -> str | None:
        return None

    def state(self) -> PolicyState:
        return {"k": self.k}
