"""Predicted speedup of each (drafter, policy) configuration from measured inputs.

Inputs (all measured by ``spectune.advise.measure`` on this machine): the drafter's
acceptance alpha and coverage (the fraction of steps it proposes at), its draft cost c, and
the target's verification curve v(K). The arithmetic is the cost model's
(``spectune.control.costs``): S(K) = (1 - a^(K+1)) / ((1 - a)(K c + v(K))), blended with
plain steps where the drafter does not propose; the break-even acceptance is the alpha at
which S(K) = 1.

Acceptance is rarely i.i.d. over draft positions: a draft's later tokens read its own
earlier ones and are kept less often. Where a short probe run measured the survival curve
(``survival[j]``: the fraction of drafting steps that kept draft positions 1..j+1), the
prediction uses it: tokens per step = 1 + coverage * sum(survival[:K]), which is the i.i.d.
formula when survival[j] = alpha^(j+1). The same probe run times its steps beside plain
decoding's: what a speculative step costs beyond K c + v(K) (the engine's verification and
bookkeeping, the drafter's syncing) is added to every K's cost as one measured overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spectune.advise.measure import Survival
from spectune.control.config import PolicySpec
from spectune.control.costs import CostCurve, break_even_acceptance, predicted_speedup

__all__ = ["ConfigPrediction", "predict_config", "speedup_from_survival"]


@dataclass(frozen=True)
class ConfigPrediction:
    """One configuration: a drafter at a fixed K (or under a tuned ``threshold`` policy that
    starts at K), and what the cost model says of it."""

    drafter: str  # the candidate spec
    k: int
    alpha: float  # per-token acceptance at the decision temperature
    coverage: float  # fraction of steps with a proposal
    draft_cost: float  # c: one draft token's time over one target step's
    verify_cost: float  # v(K)
    predicted_speedup: float  # from the survival curve where measured, else i.i.d. alpha
    iid_speedup: float  # the i.i.d. formula at ``alpha``
    break_even: dict[int, float | None]  # K -> alpha where S(K) = 1 (None: never)
    policy: PolicySpec | None = None  # a tuned policy (None: fixed K); its prediction is the
    # replay of the recorded workload (``spectune.control.tune``)

    @property
    def label(self) -> str:
        return f"{self.drafter} K={self.k}" if self.policy is None else f"{self.drafter} tuned"


def predict_config(
    drafter: str,
    alpha: float,
    coverage: float,
    draft_cost: float,
    curve: CostCurve,
    k: int,
    *,
    max_k: int = 8,
    survival: Survival | None = None,
) -> ConfigPrediction:
    """The prediction for ``drafter`` at ``k``, with break-even acceptances for 1..max_k,
    from a probe run's ``survival`` where there is one (module docstring)."""
    iid = predicted_speedup(alpha, draft_cost, curve, k, coverage=min(1.0, coverage))
    speedup = iid
    if survival is not None and survival.kept:
        # cost(K) = the probe's measured step cost + the model's difference from its K: at
        # the probe's K the cost is the measured one, whatever the curve's noise there.
        overhead = survival.step_cost - _step_cost(survival.coverage, draft_cost, curve, survival.k)
        speedup = speedup_from_survival(
            survival.kept, survival.coverage, draft_cost, curve, k, overhead=overhead
        )
    break_even = {j: break_even_acceptance(draft_cost, curve, j) for j in range(1, max_k + 1)}
    return ConfigPrediction(
        drafter, k, alpha, coverage, draft_cost, curve.relative(k), speedup, iid, break_even
    )


def _step_cost(coverage: float, draft_cost: float, curve: CostCurve, k: int) -> float:
    """A step's modelled cost in plain steps: K c + v(K) where the drafter proposes, one
    plain step elsewhere."""
    return coverage * (k * draft_cost + curve.relative(k)) + (1.0 - coverage)


def speedup_from_survival(
    survival: Sequence[float],
    coverage: float,
    draft_cost: float,
    curve: CostCurve,
    k: int,
    *,
    overhead: float = 0.0,
) -> float:
    """S(K) from a measured survival curve, ``overhead`` plain steps added to each step's
    cost; past the curve's end each further position is kept at its last conditional rate
    (survival[-1] / survival[-2])."""
    kept = list(survival[:k])
    while len(kept) < k:
        last = kept[-1]
        before = kept[-2] if len(kept) > 1 else 1.0
        kept.append(last * (last / before if before > 0 else 0.0))
    tokens = 1.0 + coverage * sum(kept)
    return tokens / max(1e-9, _step_cost(coverage, draft_cost, curve, k) + overhead)
