"""Health of a speculative run, judged against the project's targets.

Targets (the seed's): acceptance rate 60-85%, draft latency share below 40%, speedup
1.5-2.5x over plain decoding, fallback on fewer than 5% of steps. Each value is ``ok``,
``low`` or ``high`` against its band, or ``n/a`` when it cannot be computed (nothing
drafted; no plain-decoding baseline for the speedup).
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.monitor.stats import Rates

__all__ = ["TARGETS", "HealthCheck", "Target", "health"]


@dataclass(frozen=True)
class Target:
    label: str
    field: str  # the ``Rates`` attribute
    low: float | None  # below this: "low" (None: no lower bound)
    high: float | None  # at or above this: "high" (None: no upper bound)
    percent: bool  # shown as a percentage

    def band(self) -> str:
        def fmt(x: float) -> str:
            return f"{x:.0%}" if self.percent else f"{x:g}x"

        if self.low is not None and self.high is not None:
            return f"{fmt(self.low)} - {fmt(self.high)}"
        if self.high is not None:
            return f"< {fmt(self.high)}"
        assert self.low is not None
        return f">= {fmt(self.low)}"


TARGETS = (
    Target("acceptance rate", "acceptance_rate", 0.60, 0.85, True),
    Target("draft latency share", "draft_share", None, 0.40, True),
    Target("speedup", "estimated_speedup", 1.5, 2.5, False),
    Target("fallback frequency", "fallback_frequency", None, 0.05, True),
)


@dataclass(frozen=True)
class HealthCheck:
    target: Target
    value: float | None
    status: str  # "ok" | "low" | "high" | "n/a"

    def shown(self) -> str:
        if self.value is None:
            return "n/a"
        return f"{self.value:.1%}" if self.target.percent else f"{self.value:.2f}x"


def health(rates: Rates) -> list[HealthCheck]:
    checks = []
    for target in TARGETS:
        value: float | None = getattr(rates, target.field)
        if value is None:
            status = "n/a"
        elif target.low is not None and value < target.low:
            status = "low"
        elif target.high is not None and (
            value > target.high if target.low is not None else value >= target.high
        ):
            status = "high"
        else:
            status = "ok"
        checks.append(HealthCheck(target, value, status))
    return checks
