"""Drive a K policy with scripted steps, without models: a test double for controllers.

``drive`` plays the engine's side of the contract: ask ``plan()``, fabricate the step's
``StepRecord`` from a script (acceptance, timings), give the record the plan's ``reason``
as its fallback when K is 0 (as the engine does), and ``observe`` it. The K
trajectory comes back, so a test states "these acceptances give these K" directly, with
timings injected rather than measured (no sleeps, no timed tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spectune.control.base import KPolicy
from spectune.records import StepRecord

__all__ = ["ScriptedStep", "drive", "fake_record"]


@dataclass(frozen=True)
class ScriptedStep:
    """What one scripted step does with the K it is given."""

    acceptance: float  # accepted = round(acceptance * num_draft_tokens)
    draft_time_per_token: float = 0.001  # seconds per drafted token
    target_time: float = 0.01  # seconds of the target pass
    num_draft_tokens: int | None = None  # tokens the drafter returns (None: all k)


def fake_record(
    k: int,
    accepted: int,
    *,
    num_draft_tokens: int | None = None,
    draft_time: float = 0.0,
    target_time: float = 0.01,
    index: int = 0,
    fallback: str | None = None,
    emitted: int | None = None,
    overhead_time: float = 0.0,
) -> StepRecord:
    """A record of a step that drafted ``num_draft_tokens`` (default ``k``) tokens and kept
    ``accepted``; it emits ``emitted`` tokens (default ``accepted + 1``: fewer when a
    request ends mid-step) and its step time is draft + target + ``overhead_time``."""
    drafted = k if num_draft_tokens is None else num_draft_tokens
    if not 0 <= accepted <= drafted:
        raise ValueError(f"need 0 <= accepted <= num_draft_tokens, got {accepted}, {drafted}")
    count = accepted + 1 if emitted is None else emitted
    return StepRecord(
        index=index,
        k=k,
        num_draft_tokens=drafted,
        accepted=accepted,
        emitted=tuple(range(10, 10 + count)),  # token ids do not matter to policies
        draft_time=draft_time,
        target_time=target_time,
        step_time=draft_time + target_time + overhead_time,
        fallback=fallback,
    )


def drive(
    policy: KPolicy,
    script: Sequence[ScriptedStep | float] | Callable[[int, int], ScriptedStep | float],
    steps: int | None = None,
) -> list[int]:
    """Run ``policy`` over a script; returns the K it asked for at each step.

    ``script`` is a sequence (one entry per step) or a function ``(step, k) -> entry``
    (then ``steps`` says how many); a float entry is an acceptance with default timings.
    """
    count = len(script) if isinstance(script, Sequence) else steps
    if count is None:
        raise ValueError("a script function needs a number of steps")
    trajectory = []
    for index in range(count):
        plan = policy.plan()
        k = plan.k
        entry = script[index] if isinstance(script, Sequence) else script(index, k)
        step = entry if isinstance(entry, ScriptedStep) else ScriptedStep(float(entry))
        drafted = k if step.num_draft_tokens is None else min(k, step.num_draft_tokens)
        record = fake_record(
            k,
            round(step.acceptance * drafted),
            num_draft_tokens=drafted,
            draft_time=step.draft_time_per_token * drafted,
            target_time=step.target_time,
            index=index,
            fallback=plan.reason if k == 0 else None,
        )
        policy.observe(record)
        trajectory.append(k)
    return trajectory
