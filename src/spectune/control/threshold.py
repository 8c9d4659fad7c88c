"""``threshold``: the seed's checklist for K, with hysteresis.

Rule: start at ``initial_k`` (4); when the acceptance rate (accepted / positions tested,
``StepRecord.positions``: a chain's draft tokens, a tree's depth) is above
``raise_above`` (80%) K goes up by one, to ``max_k`` (8) at most; below ``lower_below``
(60%) it goes down by one, to ``min_k`` (1) at least. When the sampling temperature is
above ``hot_temperature`` (0.7) the policy is one step more conservative: it drafts
K - 1, never fewer than one. ``min_k`` bounds where the acceptance rule moves K, the
temperature rule steps down from there: a tuned ``min_k = 2`` with the rule on drafts 2
tokens cold and 1 hot (the best fixed K can differ by temperature).

Hysteresis, so K does not oscillate:
- a decision reads the acceptance of the last ``window`` (4) speculative steps, not of
  one step, and is only taken once the window is full;
- K moves only after ``patience`` (2) consecutive decisions agree;
- after a move the window is emptied, so the new K is judged on its own steps only.
K therefore changes at most once every ``window + patience - 1`` speculative steps, and a
sequence that alternates good and bad steps averages out inside the window.

Note that accepted / positions falls with K for a fixed per-token acceptance alpha (a
rejection also discards the draft tokens after it): alpha = 0.8 gives 80% at K = 1 but
59% at K = 4. The rule therefore settles on the K whose rate lies in the band, which is
what the seed's checklist asks for; the ``cost`` policy models alpha directly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from spectune.control.base import PolicyState, StepPlan
from spectune.errors import InvalidParameterError
from spectune.records import MAX_K, StepRecord

__all__ = ["ThresholdConfig", "ThresholdK"]


@dataclass(frozen=True)
class ThresholdConfig:
    initial_k: int = 4
    min_k: int = 1
    max_k: int = 8
    raise_above: float = 0.8  # window acceptance above this votes K + 1
    lower_below: float = 0.6  # window acceptance below this votes K - 1
    window: int = 4  # speculative steps one decision reads
    patience: int = 2  # consecutive agreeing decisions before K moves
    hot_temperature: float = 0.7  # above this temperature K is one lower

    def __post_init__(self) -> None:
        if not 1 <= self.min_k <= self.max_k <= MAX_K:
            raise InvalidParameterError(
                f"need 1 <= min_k <= max_k <= {MAX_K}, got min_k={self.min_k} max_k={self.max_k}"
            )
        if not self.min_k <= self.initial_k <= self.max_k:
            raise InvalidParameterError(
                f"initial_k must be in [min_k, max_k] = [{self.min_k}, {self.max_k}], "
                f"got {self.initial_k}"
            )
        if not 0.0 <= self.lower_below <= self.raise_above <= 1.0:
            raise InvalidParameterError(
                "need 0 <= lower_below <= raise_above <= 1, got "
                f"lower_below={self.lower_below} raise_above={self.raise_above}"
            )
        if self.window < 1 or self.patience < 1:
            raise InvalidParameterError("window and patience must be >= 1")
        if self.hot_temperature < 0.0:
            raise InvalidParameterError("hot_temperature must be >= 0")


class ThresholdK:
    """K up on high acceptance, down on low, with a window and patience (module docstring)."""

    def __init__(self, config: ThresholdConfig | None = None, *, temperature: float = 0.0) -> None:
        self.config = config or ThresholdConfig()
        self.k = self.config.initial_k  # the K before the temperature rule
        self.offset = 1 if temperature > self.config.hot_temperature else 0
        self.window: deque[tuple[int, int]] = deque(
            maxlen=self.config.window
        )  # (positions, accepted)
        self.streak = 0  # > 0: consecutive votes to raise, < 0: to lower
        self.last_rate: float | None = None

    def plan(self) -> StepPlan:
        # Never holds speculation off by itself (K >= 1), so never a reason.
        return StepPlan(max(1, self.k - self.offset))

    def observe(self, record: StepRecord) -> None:
        if record.num_draft_tokens == 0:
            return  # a plain (or empty-draft) step says nothing about acceptance
        cfg = self.config
        self.window.append((record.positions, record.accepted))
        if len(self.window) < cfg.window:
            return
        positions = sum(p for p, _ in self.window)
        self.last_rate = sum(a for _, a in self.window) / positions
        vote = (
            1 if self.last_rate > cfg.raise_above else -1 if self.last_rate < cfg.lower_below else 0
        )
        if vote == 0:
            self.streak = 0
        elif vote * self.streak > 0:
            self.streak += vote
        else:
            self.streak = vote
        if abs(self.streak) >= cfg.patience:
            moved = min(cfg.max_k, max(cfg.min_k, self.k + vote))
            self.streak = 0
            if moved != self.k:
                self.k = moved
                self.window.clear()

    def state(self) -> PolicyState:
        return {
            "k": self.k,
            "temperature_offset": self.offset,
            "window_acceptance": None if self.last_rate is None else round(self.last_rate, 4),
            "streak": self.streak,
        }
