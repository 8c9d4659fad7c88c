"""Build a K policy by name: ``make_policy("threshold", options, params=...)``.

One policy instance serves one request (policies own their state); callers build a fresh
one per request. Every policy except ``fixed`` is wrapped in the fallback checks named by
the ``checks`` option (default ``["global", "local"]``, in that order; ``cost`` defaults
to ``["global"]``, since its own model already decides when speculation pays; ``fixed`` defaults
to none, so the baselines stay fixed). The checks' options live in the ``local`` and
``global`` tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spectune.control.base import FixedK, KPolicy
from spectune.control.config import DEFAULT_POLICY, POLICIES, PolicySpec, options_into
from spectune.control.cost import CostConfig, CostK, LearnedCurve
from spectune.control.costs import CostCurve
from spectune.control.fallback import (
    FallbackCheck,
    GlobalFallback,
    GlobalFallbackConfig,
    Guarded,
    LocalFallback,
    LocalFallbackConfig,
)
from spectune.control.threshold import ThresholdConfig, ThresholdK
from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams

__all__ = ["DEFAULT_POLICY", "POLICIES", "build_policy", "make_policy", "shared_calibration"]


@dataclass(frozen=True)
class _FixedConfig:
    k: int = 4


@dataclass(frozen=True)
class _Context:
    params: SamplingParams
    cost_curve: CostCurve | None
    calibration: LearnedCurve | None = None


def _threshold(options: Mapping[str, Any], ctx: _Context) -> KPolicy:
    config = options_into(ThresholdConfig, options, "threshold")
    return ThresholdK(config, temperature=ctx.params.temperature)


def _cost(options: Mapping[str, Any], ctx: _Context) -> KPolicy:
    config = options_into(CostConfig, options, "cost")
    return CostK(config, cost_curve=ctx.cost_curve, calibration=ctx.calibration)


def _fixed(options: Mapping[str, Any], ctx: _Context) -> KPolicy:
    return FixedK(options_into(_FixedConfig, options, "fixed").k)


# name -> (builder, default checks)
_POLICIES: dict[str, tuple[Callable[[Mapping[str, Any], _Context], KPolicy], tuple[str, ...]]] = {
    # global first: when both hold K at 0, the permanent reason is the one recorded
    "threshold": (_threshold, ("global", "local")),
    # The cost model already returns K = 0 whenever no K beats plain decoding, so the
    # acceptance-based local pause would only override it: on a flat verification curve
    # K = 1 pays at 20% acceptance (measured), which the 50% rule would switch off.
    "cost": (_cost, ("global",)),
    "fixed": (_fixed, ()),
}


def _local(options: Mapping[str, Any], ctx: _Context) -> FallbackCheck:
    return LocalFallback(options_into(LocalFallbackConfig, options, "local"))


def _global(options: Mapping[str, Any], ctx: _Context) -> FallbackCheck:
    config = options_into(GlobalFallbackConfig, options, "global")
    return GlobalFallback(config, cost_curve=ctx.cost_curve)


_CHECKS: dict[str, Callable[[Mapping[str, Any], _Context], FallbackCheck]] = {
    "local": _local,
    "global": _global,
}
_CHECK_CONFIGS: dict[str, type[LocalFallbackConfig] | type[GlobalFallbackConfig]] = {
    "local": LocalFallbackConfig,
    "global": GlobalFallbackConfig,
}


def make_policy(
    name: str,
    config: Mapping[str, Any] | None = None,
    *,
    params: SamplingParams | None = None,
    cost_curve: CostCurve | None = None,
    calibration: LearnedCurve | None = None,
) -> KPolicy:
    """A fresh policy for one request.

    name        ``threshold`` | ``cost`` | ``fixed``.
    config      the policy's options (a TOML policy file's contents, ``--policy-opt``
                overrides merged in): the policy's own keys, ``checks`` (list of
                ``local``/``global``) and the ``local`` and ``global`` tables.
    params      the request's sampling parameters (``threshold`` reads the temperature).
    cost_curve  the target's measured verification curve (``cost`` and the global check
                use it; without it they learn from the records).
    calibration ``cost``'s verification-curve learner shared between the requests of one
                target (``shared_calibration``); None: each request learns alone.
    """
    if name not in _POLICIES:
        raise InvalidParameterError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    options = dict(config or {})
    builder, default_checks = _POLICIES[name]
    checks = options.pop("checks", list(default_checks))
    tables = {kind: options.pop(kind, {}) for kind in _CHECKS}
    if not isinstance(checks, list | tuple) or any(c not in _CHECKS for c in checks):
        raise InvalidParameterError(
            f"option checks must be a list drawn from {', '.join(_CHECKS)}, got {checks!r}"
        )
    for kind, table in tables.items():
        if not isinstance(table, Mapping):
            raise InvalidParameterError(f"option {kind} must be a table of options")
    ctx = _Context(params or SamplingParams(), cost_curve, calibration)
    policy = builder(options, ctx)
    # Every table is parsed, so a typo in an unused one is not silently ignored; only the
    # checks asked for are built.
    for kind, config_type in _CHECK_CONFIGS.items():
        options_into(config_type, tables[kind], kind)
    if not checks:
        return policy
    return Guarded(
        policy, [_CHECKS[kind](tables[kind], ctx) for kind in dict.fromkeys(checks)], name=name
    )


def build_policy(
    spec: PolicySpec,
    *,
    params: SamplingParams | None = None,
    cost_curve: CostCurve | None = None,
    calibration: LearnedCurve | None = None,
) -> KPolicy:
    """``make_policy`` for a ``PolicySpec`` (what the CLI parses)."""
    return make_policy(
        spec.name, spec.options, params=params, cost_curve=cost_curve, calibration=calibration
    )


def shared_calibration(
    name: str, config: Mapping[str, Any] | None, cost_curve: CostCurve | None
) -> LearnedCurve | None:
    """A verification-curve learner for the ``cost`` policies of one target's requests to
    share (``make_policy(..., calibration=...)``), built with that policy's options and
    ``cost_curve`` as its prior; None for other policies (or bad options, which
    ``make_policy`` reports)."""
    if name != "cost":
        return None
    options = {k: v for k, v in (config or {}).items() if k != "checks" and k not in _CHECKS}
    try:
        cfg = options_into(CostConfig, options, "cost")
    except InvalidParameterError:
        return None
    return LearnedCurve(cfg.smoothing, cfg.verify_slope_prior, prior=cost_curve)
