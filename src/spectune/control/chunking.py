"""How many groups a chain draft is verified in: group sizes and the expected-cost model.

Chunked verification itself (``spectune.verify.grouped``) explains the groups; this module
holds the part a K policy needs to choose them (``CostK`` and the fallback checks).
"""

from __future__ import annotations

import functools

from spectune.control.costs import CostCurve
from spectune.errors import InvalidParameterError

__all__ = [
    "best_groups",
    "cheapest",
    "chunked_costs",
    "chunked_pays",
    "expected_chunked_cost",
    "group_bounds",
]


def group_bounds(k: int, groups: int) -> list[int]:
    """End index (exclusive, over the k draft tokens) of each group; sizes differ by <= 1,
    the smaller groups first (an early rejection then wastes the least)."""
    return list(_group_bounds(k, groups))


@functools.cache  # a K decision asks for the same few dozen layouts every step
def _group_bounds(k: int, groups: int) -> tuple[int, ...]:
    if groups < 1:
        raise InvalidParameterError(f"verification groups must be >= 1, got {groups}")
    groups = max(1, min(groups, k))
    base, extra = divmod(k, groups)
    sizes = [base + (1 if i >= groups - extra else 0) for i in range(groups)]
    bounds, end = [], 0
    for size in sizes:
        end += size
        bounds.append(end)
    return tuple(bounds)


def expected_chunked_cost(curve: CostCurve, alpha: float, k: int, groups: int) -> float:
    """Expected target cost of verifying k tokens in ``groups`` groups, in units of one
    single-token forward (so ``groups == 1`` gives ``curve.relative(k)``).

    Group j runs only if every earlier draft token was accepted; with i.i.d. acceptance
    ``alpha`` that has probability alpha^(tokens before group j).
    """
    if k == 0:
        return 1.0
    cost, start = 0.0, 0
    bounds = _group_bounds(k, groups)
    for j, end in enumerate(bounds):
        tokens = end - start + (1 if j == len(bounds) - 1 else 0)  # the last adds the bonus row
        cost += alpha**start * curve.time(tokens)
        start = end
    return cost / curve.seconds[0]


def chunked_pays(curve: CostCurve, alpha: float, k: int, groups: int) -> bool:
    """Whether verifying in ``groups`` groups is expected to cost less target time than one
    pass. The emitted tokens are the same either way, so cost alone decides."""
    if groups <= 1 or k < 2:
        return False
    return expected_chunked_cost(curve, alpha, k, groups) < curve.relative(k)


def chunked_costs(curve: CostCurve, alpha: float, k: int, max_groups: int) -> list[float]:
    """``expected_chunked_cost`` for 1..max_groups groups (entry m - 1: m groups)."""
    return [expected_chunked_cost(curve, alpha, k, m) for m in range(1, max(1, max_groups) + 1)]


def best_groups(curve: CostCurve, alpha: float, k: int, *, max_groups: int = 4) -> int:
    """The number of groups in [1, max_groups] with the lowest expected cost."""
    return cheapest(chunked_costs(curve, alpha, k, max_groups))


def cheapest(costs: list[float]) -> int:
    """The group count (1-based) of the lowest of ``chunked_costs`` (ties: fewer groups)."""
    return min(range(1, len(costs) + 1), key=lambda m: (costs[m - 1], m))
