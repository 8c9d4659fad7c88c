"""Tree vs chain speculation at equal target cost.

For a node budget n, the chain drafts K = n tokens and the tree drafts n nodes (width w,
depth up to n): both make the target forward n + 1 tokens per step, so any gain in mean
accepted length is the tree's. Reported per temperature: mean accepted length (tokens
per step), tokens/s, and target tokens per step (to show the costs really were equal),
with plain decoding of the same prompts as the baseline both are measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spectune.drafters.pairing import tree_drafter_for
from spectune.drafters.tree import TreeShape
from spectune.experiments.common import DecodeStats, Setup, decode_prompts
from spectune.sampling import SamplingParams

__all__ = ["TreeComparison", "speedup", "tree_vs_chain"]


def speedup(stats: DecodeStats, baseline: DecodeStats) -> float:
    """Tokens/s of ``stats`` over the baseline's (0 when the baseline has none)."""
    base = baseline.tokens_per_second
    return stats.tokens_per_second / base if base else 0.0


@dataclass(frozen=True)
class TreeComparison:
    temperature: float
    budget: int  # draft tokens (chain K) = tree nodes
    width: int  # the tree's children per expanded node
    chain: DecodeStats
    tree: DecodeStats
    plain: DecodeStats  # the same prompts without speculation (shared per temperature)

    @property
    def accepted_length_gain(self) -> float:
        """Relative gain of the tree's mean accepted length over the chain's."""
        base = self.chain.mean_accepted_length
        return self.tree.mean_accepted_length / base - 1.0 if base else 0.0

    @property
    def speed_gain(self) -> float:
        base = self.chain.tokens_per_second
        return self.tree.tokens_per_second / base - 1.0 if base else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "temperature": self.temperature,
            "budget": self.budget,
            "width": self.width,
            "chain": self.chain.as_dict(),
            "tree": self.tree.as_dict(),
            "plain": self.plain.as_dict(),
            "accepted_length_gain": round(self.accepted_length_gain, 4),
            "speed_gain": round(self.speed_gain, 4),
            "chain_vs_plain": round(speedup(self.chain, self.plain), 4),
            "tree_vs_plain": round(speedup(self.tree, self.plain), 4),
        }


def tree_vs_chain(
    setup: Setup,
    *,
    budgets: Sequence[int] = (4, 8),
    widths: Sequence[int] = (2,),
    min_path_prob: float = 0.0,
    temperatures: Sequence[float] = (0.0, 0.7),
    max_tokens: int = 48,
    seed: int = 0,
) -> list[TreeComparison]:
    """One chain run per (temperature, budget), compared with a tree of every width, and
    one plain run per temperature."""
    results: list[TreeComparison] = []
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        plain = decode_prompts(setup, "plain", lambda: None, params, 0, seed=seed)
        for budget in budgets:
            chain = decode_prompts(
                setup, f"chain K={budget}", setup.fresh_drafter, params, budget, seed=seed
            )
            for width in widths:
                shape = TreeShape(width=width, nodes=budget, min_path_prob=min_path_prob)
                tree = decode_prompts(
                    setup,
                    f"tree w={width} n={budget}",
                    lambda shape=shape: tree_drafter_for(  # type: ignore[misc]
                        setup.fresh_drafter(), setup.target, shape
                    ),
                    params,
                    budget,
                    seed=seed,
                )
                results.append(TreeComparison(temperature, budget, width, chain, tree, plain))
    return results
