"""K policies (controllers) for speculative decoding, and the fallback checks around them.

Build one per request by name: ``make_policy("threshold" | "cost" | "fixed", options,
params=..., cost_curve=...)``. Each answers ``plan() -> StepPlan`` before a step and
``observe(record)`` after it (``spectune.control.base``).
"""

from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports

if TYPE_CHECKING:
    from spectune.control.base import FixedK, KPolicy, PolicyState, ReportsState, StepPlan
    from spectune.control.config import PolicySpec, load_policy_file, parse_policy_opts, policy_spec
    from spectune.control.cost import CostConfig, CostK
    from spectune.control.fallback import (
        FallbackCheck,
        GlobalFallback,
        GlobalFallbackConfig,
        Guarded,
        Hold,
        LocalFallback,
        LocalFallbackConfig,
    )
    from spectune.control.registry import DEFAULT_POLICY, POLICIES, build_policy, make_policy
    from spectune.control.threshold import ThresholdConfig, ThresholdK
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.control.base": [
                "FixedK",
                "KPolicy",
                "PolicyState",
                "ReportsState",
                "StepPlan",
            ],
            "spectune.control.config": [
                "PolicySpec",
                "load_policy_file",
                "parse_policy_opts",
                "policy_spec",
            ],
            "spectune.control.cost": ["CostConfig", "CostK"],
            "spectune.control.fallback": [
                "FallbackCheck",
                "GlobalFallback",
                "GlobalFallbackConfig",
                "Guarded",
                "Hold",
                "LocalFallback",
                "LocalFallbackConfig",
            ],
            "spectune.control.registry": [
                "DEFAULT_POLICY",
                "POLICIES",
                "build_policy",
                "make_policy",
            ],
            "spectune.control.threshold": ["ThresholdConfig", "ThresholdK"],
        },
    )

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CostConfig",
    "CostK",
    "FallbackCheck",
    "FixedK",
    "GlobalFallback",
    "GlobalFallbackConfig",
    "Guarded",
    "Hold",
    "KPolicy",
    "LocalFallback",
    "LocalFallbackConfig",
    "PolicySpec",
    "PolicyState",
    "ReportsState",
    "StepPlan",
    "ThresholdConfig",
    "ThresholdK",
    "build_policy",
    "load_policy_file",
    "make_policy",
    "parse_policy_opts",
    "policy_spec",
]
