"""Chunked vs one-pass verification for K = 4 and 8.

Both emit the same tokens (``spectune.verify.grouped``); what differs is the target's work. The
experiment measures, per K and number of groups: tokens/s, target tokens forwarded per
step, the acceptance rate, and what the cost model predicts from the measured
verification-cost curve (``chunked_pays``), so the README can say where chunking pays on
this machine and where it does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from spectune.control.chunking import chunked_pays, expected_chunked_cost
from spectune.control.costs import CostCurve, measure_forward_curve
from spectune.experiments.common import CountingModel, DecodeStats, Setup, decode_prompts
from spectune.sampling import SamplingParams

__all__ = ["ChunkedRow", "chunked_vs_one_pass"]


@dataclass(frozen=True)
class ChunkedRow:
    k: int
    groups: int  # 1 = one pass
    stats: DecodeStats
    target_tokens: int  # counted at the model, prefills excluded
    predicted_cost: float  # expected target cost per step, in single-token forwards
    predicted_pays: bool

    @property
    def acceptance_rate(self) -> float:
        return self.stats.acceptance

    def as_dict(self) -> dict[str, object]:
        return {
            "k": self.k,
            "groups": self.groups,
            **self.stats.as_dict(),
            "target_tokens_per_step": round(self.target_tokens / max(1, self.stats.steps), 3),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "predicted_cost": round(self.predicted_cost, 4),
            "predicted_pays": self.predicted_pays,
        }


def chunked_vs_one_pass(
    setup: Setup,
    *,
    ks: Sequence[int] = (4, 8),
    groups: Sequence[int] = (2, 4),
    temperature: float = 0.0,
    max_tokens: int = 48,
    curve: CostCurve | None = None,
    seed: int = 0,
) -> tuple[CostCurve, list[ChunkedRow]]:
    curve = curve or measure_forward_curve(setup.target, sizes=(1, 2, 3, 4, 5, 6, 8, 9), repeats=3)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    prefill = sum(len(p) - 1 for _, p in setup.prompts)
    rows: list[ChunkedRow] = []
    for k in ks:
        for group_count in (1, *groups):
            if group_count > k:
                continue
            counting = CountingModel(setup.target)
            counted = dataclasses.replace(setup, target=counting)
            stats = decode_prompts(
                counted,
                f"K={k} groups={group_count}",
                setup.fresh_drafter,
                params,
                k,
                verify_groups=group_count,
                seed=seed,
            )
            alpha = stats.acceptance
            rows.append(
                ChunkedRow(
                    k,
                    group_count,
                    stats,
                    counting.tokens_forwarded - prefill,
                    expected_chunked_cost(curve, alpha, k, group_count),
                    chunked_pays(curve, alpha, k, group_count),
                )
            )
    return curve, rows
