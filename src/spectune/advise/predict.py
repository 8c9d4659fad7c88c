"""Predicted speedup of each (drafter, policy) configuration from measured inputs.

Inputs (all measured by ``spectune.advise.measure`` on this machine): the drafter's
acceptance alpha and coverage (the fraction of steps it proposes at), its draft cost c, and
the target's verification curve v(K). The arithmetic is the cost model's
(``spectune.control.costs``): S(K) = (1 - a^(K+1)) / ((1 - a)(K c + v(K))), blended with
plain steps where the drafter does not propose; the break-even acceptance is the alpha at
which S(K) = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.control.costs import CostCurve, break_even_acceptance, predicted_speedup

__all__ = ["ConfigPrediction", "predict_config"]


@dataclass(frozen=True)
class ConfigPrediction:
    """One configuration: a drafter at a fixed K, and what the cost model says of it."""

    drafter: str  # the candidate spec
    k: int
    alpha: float  # per-token acceptance at the decision temperature
    coverage: float  # fraction of steps with a proposal
    draft_cost: float  # c: one draft token's time over one target step's
    verify_cost: float  # v(K)
    predicted_speedup: float
    break_even: dict[int, float | None]  # K -> alpha where S(K) = 1 (None: never)

    @property
    def label(self) -> str:
        return f"{self.drafter} K={self.k}"


def predict_config(
    drafter: str,
    alpha: float,
    coverage: float,
    draft_cost: float,
    curve: CostCurve,
    k: int,
    *,
    max_k: int = 8,
) -> ConfigPrediction:
    """The prediction for ``drafter`` at ``k``, with break-even acceptances for 1..max_k."""
    speedup = predicted_speedup(alpha, draft_cost, curve, k, coverage=min(1.0, coverage))
    break_even = {j: break_even_acceptance(draft_cost, curve, j) for j in range(1, max_k + 1)}
    return ConfigPrediction(
        drafter, k, alpha, coverage, draft_cost, curve.relative(k), speedup, break_even
    )
