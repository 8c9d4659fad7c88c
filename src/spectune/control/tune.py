"""Fit the ``threshold`` policy to a workload: replay candidates, keep the fastest predicted.

A candidate is one full set of the policy's options: its own (K bounds, raise/lower
thresholds, window, patience, the temperature rule) and its fallback checks' (which checks
run; the local pause's threshold, length and back-off, which sets how often it probes; the
global cut-off on the draft's cost). ``predict`` replays the workload
(``spectune.control.workload``) through a fresh policy per request, built by the registry
from a ``PolicySpec`` exactly as ``generate``, ``bench`` and ``serve`` build one from a policy
file. Each replayed step: the policy asks for K; the drafter offers up to K tokens (the
recorded draft length); the run of accepted tokens is what the recorded outcomes and the
per-position acceptance model say; the step costs what this machine's measured costs say
(``StepCosts``); the policy observes that record, as it would the engine's. Predicted
tokens/s = emitted tokens / seconds over the whole workload.

Search (``search``): the K bounds jointly (``min_k``, ``max_k``, ``initial_k`` over
``K_BOUNDS``), then one option at a time over its grid (``GRID``, coordinate descent),
repeated until a round changes nothing (at most ``ROUNDS``). A new value must beat the
incumbent by ``MIN_GAIN`` (relative), so a parameter leaves the seed's value only when the
workload says it pays; then a fallback check that fires must be predicted to pay
``CHECK_GAIN`` or it goes, unless drafting without it is predicted slower than plain
decoding (``_robust_checks``). Everything starts at the
seed's rules, which are the defaults of ``ThresholdConfig``, ``LocalFallbackConfig`` and
``GlobalFallbackConfig`` (start at K = 4, raise above 80%, lower below 60%, K - 1 above
T = 0.7, pause after 5 steps under 50%, disable when a draft step costs over 50% of a
target step). Options that cannot matter are
not searched: the temperature rule on a greedy-only workload, a check's options while the
check is off.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from spectune.control.config import PolicySpec
from spectune.control.fallback import GlobalFallbackConfig, LocalFallbackConfig
from spectune.control.registry import build_policy
from spectune.control.replay import fake_record
from spectune.control.threshold import ThresholdConfig
from spectune.control.workload import StepCosts, Workload
from spectune.errors import InvalidParameterError
from spectune.records import CountsReport, SpecCounts
from spectune.sampling import SamplingParams

__all__ = [
    "FIXED_KS",
    "GRID",
    "K_KEYS",
    "CHECK_GAIN",
    "MIN_GAIN",
    "ROUNDS",
    "RULES",
    "RULE_OFF_TEMPERATURE",
    "Prediction",
    "TuneResult",
    "params_spec",
    "planned_evaluations",
    "policy_toml",
    "predict",
    "search",
    "seed_params",
]

ROUNDS = 3
MIN_GAIN = 0.005  # a new value must beat the incumbent's predicted tokens/s by 0.5%
# A fallback check that pauses drafting must be predicted to pay this much to stay, unless
# drafting without it is predicted slower than plain decoding (``search``): its gain rests on
# this workload's runs of bad steps, which new traffic does not repeat. Measured: a local
# pause predicted +0.6% on the dev split cost 3% on the test split at T = 0.7
# (docs/results/bench-tuned, the first tuning); one predicted +0.6% where drafting paid 1%
# without it cost 2.4% there (docs/results/bench-tune-int4).
CHECK_GAIN = 0.02
RULE_OFF_TEMPERATURE = 100.0  # hot_temperature at the sampling limit: the K - 1 rule never fires
FIXED_KS = tuple(range(1, 9))
K_KEYS = (
    "initial_k",
    "min_k",
    "max_k",
)  # searched jointly  # fixed-K baselines predicted beside the search

# Grids of the options searched one at a time (the K bounds are searched jointly).
GRID: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "raise_above": (0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
        "lower_below": (0.0, 0.2, 0.3, 0.4, 0.5, 0.6),
        "window": (2, 4, 8),
        "patience": (1, 2, 3),
        "hot_temperature": (0.3, 0.7, 1.0, RULE_OFF_TEMPERATURE),
        "checks": (("global", "local"), ("global",), ("local",), ()),
        "local.below": (0.1, 0.2, 0.3, 0.4, 0.5),
        "local.bad_steps": (3, 5, 8, 12),
        "local.backoff_tokens": (8, 16, 32, 64),
        "global.max_draft_ratio": (0.25, 0.5, 1.0, 2.0, 4.0),
    }
)

# The seed's rule behind each option, for the report.
RULES: Mapping[str, str] = MappingProxyType(
    {
        "initial_k": "start K at 3-4",
        "min_k": "K bounds",
        "max_k": "K bounds",
        "raise_above": "raise K above 80% acceptance",
        "lower_below": "lower K below 60% acceptance",
        "window": "(hysteresis) steps per decision",
        "patience": "(hysteresis) agreeing decisions per move",
        "hot_temperature": "K - 1 above T = 0.7",
        "checks": "fallback checks that run",
        "local.below": "pause under 50% acceptance",
        "local.bad_steps": "pause after 5 bad steps",
        "local.backoff_tokens": "plain tokens before a probe",
        "global.max_draft_ratio": "disable over 50% draft cost",
    }
)


def seed_params() -> dict[str, Any]:
    """The seed's rules as flat options (the policies' own defaults, never restated)."""
    threshold, local, cut = ThresholdConfig(), LocalFallbackConfig(), GlobalFallbackConfig()
    return {
        "initial_k": threshold.initial_k,
        "min_k": threshold.min_k,
        "max_k": threshold.max_k,
        "raise_above": threshold.raise_above,
        "lower_below": threshold.lower_below,
        "window": threshold.window,
        "patience": threshold.patience,
        "hot_temperature": threshold.hot_temperature,
        "checks": ("global", "local"),  # the registry's default for ``threshold``
        "local.below": local.below,
        "local.bad_steps": local.bad_steps,
        "local.backoff_tokens": local.backoff_tokens,
        "global.max_draft_ratio": cut.max_draft_ratio,
    }


def params_spec(params: Mapping[str, Any]) -> PolicySpec:
    """Flat options (``local.below``) as the nested ``PolicySpec`` a policy file gives."""
    options: dict[str, Any] = {}
    for key, value in params.items():
        *tables, leaf = key.split(".")
        target = options
        for table in tables:
            target = target.setdefault(table, {})
        target[leaf] = list(value) if isinstance(value, tuple) else value
    return PolicySpec("threshold", options)


@dataclass(frozen=True)
class Prediction(CountsReport):
    """A replay's totals over the workload: the counters of every replayed step."""

    counts: SpecCounts

    @property
    def tokens(self) -> int:
        return self.counts.emitted

    @property
    def seconds(self) -> float:
        return self.counts.step_time

    @property
    def steps(self) -> int:
        return self.counts.steps


def predict(workload: Workload, costs: StepCosts, spec: PolicySpec) -> Prediction:
    """Replay every request of ``workload`` through a fresh policy built from ``spec``."""
    counts = SpecCounts()
    rates = workload.position_acceptance
    for timeline in workload.timelines:
        policy = build_policy(spec, params=SamplingParams(temperature=timeline.temperature))
        position = 0
        while position < timeline.tokens:
            remaining = timeline.tokens - position
            plan = policy.plan()
            k = max(0, min(plan.k, remaining - 1))  # as the engine clips it
            offered = timeline.offered(position, k) if k else 0
            run = timeline.accepted_run(position, offered, rates)
            emitted = min(run + 1, remaining)
            draft_time, target_time, overhead = costs.step(k, offered)
            record = fake_record(
                k,
                run,
                num_draft_tokens=offered,
                draft_time=draft_time,
                target_time=target_time,
                overhead_time=overhead,
                emitted=emitted,
                index=counts.steps,
                fallback=plan.reason if k == 0 else None,
            )
            policy.observe(record)
            counts.add(record)
            position += emitted
    return Prediction(counts)


@dataclass(frozen=True)
class TuneResult:
    best: Mapping[str, Any]  # flat options of the chosen policy
    predicted: Prediction  # the chosen policy on the workload
    seed: Prediction  # the seed's rules (the default threshold policy)
    fixed: Mapping[int, Prediction]  # fixed K baselines
    plain: Prediction  # K = 0
    # option -> the tuned options with that one (the K bounds: all three) at the seed's value
    reverts: Mapping[str, Prediction | None]
    evaluated: int  # candidate replays run

    @property
    def best_fixed_k(self) -> int:
        return max(self.fixed, key=lambda k: self.fixed[k].tokens_per_second)


def _k_bounds() -> Iterator[tuple[int, int, int]]:
    """(min_k, max_k, initial_k) candidates."""
    for min_k in (1, 2, 3, 4, 6, 8):
        for max_k in (1, 2, 3, 4, 6, 8):
            if max_k < min_k:
                continue
            for initial in sorted({min_k, 2, 3, 4, 6, max_k}):
                if min_k <= initial <= max_k:
                    yield min_k, max_k, initial


def _searched(key: str, params: Mapping[str, Any], workload: Workload) -> bool:
    """Whether option ``key`` can change anything for ``params`` on ``workload``."""
    if key == "hot_temperature":
        return any(t > 0 for t in workload.temperatures)
    table = key.split(".")[0] if "." in key else None
    return table is None or table in params["checks"]


def planned_evaluations(workload: Workload) -> int:
    """An upper bound on the replays ``search`` runs (for a progress bar)."""
    per_round = sum(1 for _ in _k_bounds()) + sum(len(v) for v in GRID.values())
    baselines = len(FIXED_KS) + 2 + len(seed_params())
    return ROUNDS * per_round + baselines


def search(
    workload: Workload,
    costs: StepCosts,
    *,
    on_evaluation: Callable[[], None] | None = None,
) -> TuneResult:
    """The fastest predicted ``threshold`` options for ``workload`` (module docstring)."""
    cache: dict[str, Prediction | None] = {}

    def score(params: Mapping[str, Any]) -> Prediction | None:
        key = json.dumps(sorted(params.items()))
        if key not in cache:
            try:
                cache[key] = predict(workload, costs, params_spec(params))
            except InvalidParameterError:  # an inconsistent combination (lower > raise)
                cache[key] = None
            if on_evaluation is not None:
                on_evaluation()
        return cache[key]

    def rate(params: Mapping[str, Any]) -> float:
        prediction = score(params)
        return -1.0 if prediction is None else prediction.tokens_per_second

    seed = seed_params()
    best = dict(seed)
    best_rate = rate(best)

    def sweep(candidates: Iterator[dict[str, Any]]) -> None:
        nonlocal best, best_rate
        for candidate in candidates:
            value = rate(candidate)
            if value > best_rate * (1.0 + MIN_GAIN):
                best, best_rate = candidate, value

    for _ in range(ROUNDS):
        before = dict(best)
        base = dict(best)
        sweep(
            {**base, "min_k": lo, "max_k": hi, "initial_k": start} for lo, hi, start in _k_bounds()
        )
        for key, values in GRID.items():
            if _searched(key, best, workload):
                base = dict(best)
                sweep({**base, key: value} for value in values)
        if best == before:
            break
    plain = predict(workload, costs, PolicySpec("fixed", {"k": 0}))
    best = _robust_checks(best, rate, plain.tokens_per_second)
    predicted = score(best)
    seed_prediction = score(seed)
    assert predicted is not None and seed_prediction is not None  # both valid by construction
    fixed = {k: predict(workload, costs, PolicySpec("fixed", {"k": k})) for k in FIXED_KS}
    reverts = {}
    for key in seed:
        if best[key] != seed[key]:  # the K bounds go back together: alone they may clash
            back = K_KEYS if key in K_KEYS else (key,)
            reverts[key] = score({**best, **{name: seed[name] for name in back}})
    return TuneResult(
        best=MappingProxyType(best),
        predicted=predicted,
        seed=seed_prediction,
        fixed=MappingProxyType(fixed),
        plain=plain,
        reverts=MappingProxyType(reverts),
        evaluated=len(cache),
    )


def _robust_checks(
    best: dict[str, Any], rate: Callable[[Mapping[str, Any]], float], plain_rate: float
) -> dict[str, Any]:
    """``best`` without the fallback checks that fire on the workload but are predicted to
    pay under ``CHECK_GAIN``, where the policy without the check is still predicted at
    least as fast as plain decoding. A check that never fires here (the same prediction
    without it) stays as a safety net; where drafting without the check would not pay, the
    check is the protection and stays, whatever its margin."""
    for check in tuple(best["checks"]):
        without = {**best, "checks": tuple(c for c in best["checks"] if c != check)}
        kept, dropped = rate(best), rate(without)
        if kept != dropped and dropped >= plain_rate and kept < dropped * (1.0 + CHECK_GAIN):
            best = without
    return best


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def policy_toml(spec: PolicySpec, header: Sequence[str] = ()) -> str:
    """``spec`` as a policy file (``--policy-file``): top-level keys, then one table each."""
    lines = [f"# {line}" for line in header]
    lines.append(f"name = {_toml_value(spec.name)}")
    tables = {k: v for k, v in spec.options.items() if isinstance(v, Mapping)}
    for key, value in spec.options.items():
        if key not in tables:
            lines.append(f"{key} = {_toml_value(value)}")
    for table, values in tables.items():
        lines.append(f"\n[{table}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"
