"""The K-policy contract: what the next step should do, learned from what happened.

A policy answers one question before each step, ``plan() -> StepPlan``: how many tokens
to draft (K; 0 means "no speculation this step", plain decoding), how many groups a chain
draft is verified in (``spectune.verify.grouped``; sized with ``control/chunking.py``), and
why speculation is held off, if it is. After the step it ``observe``s the step's record.
A wrapper (``Guarded``) forwards the whole plan, so no part of the answer can be dropped on
the way to the engine. Policies own their state (one instance per request) and never touch
models or configs; ``plan()`` is pure: asking twice without an ``observe`` between gives
the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

from spectune.errors import InvalidParameterError
from spectune.records import StepRecord, validate_k

__all__ = ["FixedK", "KPolicy", "PolicyState", "ReportsState", "StepPlan"]

# A policy's inner state as flat JSON-ready values, for the step trace and the report.
PolicyState: TypeAlias = dict[str, float | int | str | bool | None]


@dataclass(frozen=True)
class StepPlan:
    """A policy's answer for the next step.

    ``verify_groups`` is a table over draft lengths because the length is known only after
    drafting: a drafter may return fewer than K tokens, and the engine cuts K to the
    tokens and context left. Entry n is the target passes for a chain draft of n tokens
    (n = 0..k); None: no preference (the engine's own setting applies). Trees and batches
    are always verified in one pass.

    ``reason`` says why the policy holds speculation off or down (``cost: ...``,
    ``local: ...``); it may come with k > 0 (a probe at K = 1). The engine records it as
    the step's fallback when the step ends up plain.

    ``shadow`` asks, on a plain step, for the drafter's one-token guess to be checked
    against the token the target emits (``StepRecord.shadow_hit``): acceptance evidence
    that costs a lookup (a model-free drafter) or one draft step (a model), not a
    verification. A one-hot guess d is kept by verification with probability p_target(d),
    the chance that the target emits d, so the evidence is unbiased at any temperature.
    A model-free drafter's guesses are one-hot at any temperature; a model's only at
    temperature 0, so the engines ask a model for guesses only then (``guesses``). Both
    engines act on it: the batched one asks for the guesses in its draft pass.
    """

    k: int  # draft tokens to propose (0: a plain step)
    verify_groups: tuple[int, ...] | None = None  # [k + 1]: groups by draft length
    reason: str | None = None
    shadow: bool = False  # k == 0: check the drafter's one-token guess (see above)

    def __post_init__(self) -> None:
        if self.k < 0:
            raise InvalidParameterError(f"a plan's k must be >= 0, got {self.k}")
        groups = self.verify_groups
        if groups is not None and (len(groups) != self.k + 1 or min(groups) < 1):
            raise InvalidParameterError(
                f"verify_groups needs k + 1 = {self.k + 1} entries >= 1, got {groups}"
            )

    def groups_for(self, tokens: int) -> int | None:
        """The groups for a chain draft of ``tokens`` (<= k) tokens; None: no preference."""
        return None if self.verify_groups is None else self.verify_groups[tokens]

    def capped(self, max_k: int, reason: str | None) -> StepPlan:
        """This plan with K at most ``max_k`` (the group table cut to match) and ``reason``."""
        k = min(self.k, max_k)
        groups = None if self.verify_groups is None else self.verify_groups[: k + 1]
        # Built directly, not with dataclasses.replace: this runs for every held row's step.
        return StepPlan(k, groups, reason, shadow=self.shadow)


@runtime_checkable
class KPolicy(Protocol):
    """Plans each step and learns from each step's record."""

    def plan(self) -> StepPlan:
        """The next step's K, verification groups and hold reason (pure: no state changes)."""
        ...

    def observe(self, record: StepRecord) -> None:
        """Learn from the step that just ran."""
        ...


@runtime_checkable
class ReportsState(Protocol):
    """Optional: a policy that can show its state (the trace records it after each step)."""

    def state(self) -> PolicyState:
        """Flat, JSON-ready values; reading them never changes the policy."""
        ...


class FixedK:
    """Always the same K: the baseline every adaptive policy is compared with."""

    def __init__(self, k: int) -> None:
        self.k = validate_k(k, allow_zero=True)

    def plan(self) -> StepPlan:
        return StepPlan(self.k)

    def observe(self, record: StepRecord) -> None:
        """Fixed: nothing to learn."""

    def state(self) -> PolicyState:
        return {"k": self.k}
