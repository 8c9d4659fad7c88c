"""``advise``: from candidate drafts to one verified recommendation.

Steps:
1. Split the prompts per category into a fitting half and a held-apart half.
2. On the fitting half, ``spectune.select`` checks each candidate (compatibility, size
   ratio, family), measures its acceptance per category at each temperature, its draft cost
   c and the machine's verification curve v(K).
3. A short probe run of each drafter on the fitting half, at each temperature, measures
   per-position acceptance (the survival curve of its draft positions), pooled and per
   category; the decision temperature's curve feeds the prediction.
4. Predict every (drafter, K) configuration's speedup and break-even acceptances
   (``spectune.advise.predict``).
5. Fit a ``threshold`` policy for the best predicted drafter: the fitting half decoded at
   K = ``max_k`` and replayed through candidate thresholds (``spectune tune``'s search,
   ``spectune.control.tune``).
6. Verify the top configurations and the tuned policy on the held-apart half: interleaved
   runs against plain decoding (``spectune.advise.measure``), predicted vs measured.
7. The verdict (``spectune.advise.verdict``) and the health checklist on the winner (or the
   best measured configuration when nothing wins).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from spectune.advise.measure import (
    Survival,
    VerifiedRun,
    conditional,
    kept_positions,
    survival_of,
    verify_interleaved,
)
from spectune.advise.predict import ConfigPrediction, predict_config
from spectune.advise.schema import Advice, CandidateCheck, ConfigResult
from spectune.advise.verdict import CheckRow, checklist, decide, withheld
from spectune.control.costs import CostCurve
from spectune.drafters.base import Drafter
from spectune.drafters.pairing import Loaded
from spectune.errors import (
    IncompatibleModelsError,
    InvalidParameterError,
    PromptError,
    SpectuneError,
)
from spectune.models.machine import LoadMeter
from spectune.models.quant import PRECISIONS, Precision
from spectune.records import SpecCounts
from spectune.select.candidates import resolve_candidate
from spectune.select.selector import CandidateResult, SelectSettings, select

__all__ = ["AdviseSettings", "advise", "split_prompts"]

Progress = Callable[[str, int, int], None]  # (step, done, total)
PromptRow = tuple[str, str, list[int]]  # (id, category, prompt tokens)


@dataclass(frozen=True)
class AdviseSettings:
    temperatures: tuple[float, ...] = (0.0, 0.7)  # the first decides K and the prediction
    max_tokens: int = 48  # per continuation and per verification run
    verify_prompts: int = 7
    top: int = 3  # configurations verified
    max_k: int = 8
    precision: Precision = PRECISIONS["fp32"]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    runtime: str = "auto"
    trust_draft_vocab: bool = False
    tune_policy: bool = True  # also fit and verify a threshold policy (step 5)

    def __post_init__(self) -> None:
        if not self.temperatures:
            raise InvalidParameterError("give at least one temperature")
        for name in ("max_tokens", "verify_prompts", "top"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")


def split_prompts(prompts: Sequence[PromptRow]) -> tuple[list[PromptRow], list[PromptRow]]:
    """Per category, alternate prompts between fitting and verification, so both halves
    cover every category. A category with one prompt lends it to both (said in the notes)."""
    by_category: dict[str, list[PromptRow]] = {}
    for row in prompts:
        by_category.setdefault(row[1], []).append(row)
    fit: list[PromptRow] = []
    held: list[PromptRow] = []
    for rows in by_category.values():
        if len(rows) == 1:
            fit.append(rows[0])
            held.append(rows[0])
            continue
        fit.extend(rows[0::2])
        held.extend(rows[1::2])
    return fit, held


# The probe run's K: at the optimum a two-core CPU shows (K = 1-2), so the step cost is
# measured where it is used (probing at K = 3 left the winner's prediction 11% optimistic:
# the curve's noise at the probe's K moves every other K); survival past it is extrapolated.
PROBE_K = 2


def _configs(
    result: CandidateResult,
    curve: CostCurve,
    decision: float,
    max_k: int,
    survival: Survival | None,
) -> list[ConfigPrediction]:
    """The candidate's two best predicted K, at the decision temperature's acceptance and,
    where a probe run measured it, the survival curve."""
    estimate = next((a for a in result.alpha if a.temperature == decision), result.alpha[0])
    assert result.draft_cost is not None  # compatible candidates are measured
    every = [
        predict_config(
            result.spec,
            estimate.overall,
            estimate.coverage,
            result.draft_cost,
            curve,
            k,
            max_k=max_k,
            survival=survival,
        )
        for k in range(1, max_k + 1)
    ]
    return sorted(every, key=lambda p: p.predicted_speedup, reverse=True)[:2]


def _tuned(
    target: Loaded,
    base: ConfigPrediction,
    drafter: Drafter,
    fit: Sequence[PromptRow],
    curve: CostCurve,
    settings: AdviseSettings,
    on_request: Callable[[], None],
) -> ConfigPrediction:
    """``base``'s drafter under the ``threshold`` policy ``spectune tune`` fits on the fitting
    half recorded at K = ``max_k`` (greedy, as the verification runs); its prediction is the
    search's replay of that workload against plain decoding's."""
    from spectune.control.tune import params_spec, search
    from spectune.control.workload import fit_costs, fit_workload
    from spectune.monitor.recording import record_fixed_k

    requests = record_fixed_k(
        target.model,
        drafter,
        [(row[0], row[2]) for row in fit],
        settings.max_k,
        settings.max_tokens,
        (0.0,),
        on_request=on_request,
    )
    result = search(fit_workload(requests), fit_costs(requests, curve))
    k = int(result.best["initial_k"])
    return replace(
        base,
        k=k,
        verify_cost=curve.relative(k),
        predicted_speedup=result.predicted.tokens_per_second / result.plain.tokens_per_second,
        policy=params_spec(result.best),
    )


def _chosen(predictions: Sequence[ConfigPrediction], top: int) -> list[ConfigPrediction]:
    """The ``top`` best predicted, each drafter's best first (a second K of one drafter only
    when drafters run out)."""
    ranked = sorted(predictions, key=lambda p: p.predicted_speedup, reverse=True)
    firsts: list[ConfigPrediction] = []
    seen: set[str] = set()
    for p in ranked:
        if p.drafter not in seen:
            firsts.append(p)
            seen.add(p.drafter)
    rest = [p for p in ranked if p not in firsts]
    return (firsts + rest)[:top]


Curve = tuple[float, ...]  # [j]: position j+1 kept, given positions 1..j were


@dataclass(frozen=True)
class Positions:
    """One drafter's probe runs: per temperature (as text), its per-position acceptance,
    pooled and per category of the fitting prompts."""

    pooled: dict[str, Curve] = field(default_factory=dict)
    by_category: dict[str, dict[str, Curve]] = field(default_factory=dict)


def _positions(
    probes: dict[float, list[VerifiedRun]], categories: Sequence[str], k: int
) -> dict[str, Positions]:
    """Per drafter (probe label), its ``Positions``."""
    out: dict[str, Positions] = {}
    for temperature, runs in probes.items():
        for run in runs:
            by_category: dict[str, SpecCounts] = {}
            for category, counts in zip(categories, run.per_prompt, strict=True):
                by_category.setdefault(category, SpecCounts()).merge(counts)
            mine = out.setdefault(run.label, Positions())
            mine.pooled[str(temperature)] = conditional(kept_positions(run.counts, k))
            mine.by_category[str(temperature)] = {
                category: conditional(kept_positions(counts, k))
                for category, counts in sorted(by_category.items())
            }
    return out


def _check(
    result: CandidateResult, survival: Survival | None, positions: Positions, decision: float
) -> CandidateCheck:
    return CandidateCheck(
        spec=result.spec,
        kind=result.kind,
        compatible=result.compatible,
        problems=result.problems,
        size_ratio=result.size.ratio,
        size_verdict=result.size.verdict,
        acceptance={str(a.temperature): a.overall for a in result.alpha},
        acceptance_by_category={str(a.temperature): a.per_category for a in result.alpha},
        first_token_acceptance=result.alpha_at(decision),
        position_acceptance=positions.pooled,
        position_acceptance_by_category=positions.by_category,
        draft_cost=result.draft_cost,
        probe_step_cost=None if survival is None else survival.step_cost,
    )


def advise(
    target: Loaded,
    target_name: str,
    specs: Sequence[str],
    prompts: Sequence[PromptRow],
    settings: AdviseSettings,
    *,
    on_progress: Progress | None = None,
) -> Advice:
    """Measure, predict, verify and judge (module docstring). The caller writes the files
    (``Advice.write``, ``spectune.advise.report``) and fills ``Advice.outputs``."""
    started = time.perf_counter()
    meter = LoadMeter()
    if not prompts:
        raise PromptError("no prompts to measure on")
    if not specs:
        raise InvalidParameterError("give at least one draft candidate (--draft)")
    notes: list[str] = []
    # 1. Split.
    fit, held = split_prompts(prompts)
    if any(sum(1 for p in prompts if p[1] == c) == 1 for c in {p[1] for p in prompts}):
        notes.append("a category with one prompt is used for both fitting and verification")
    held = held[: settings.verify_prompts]
    # 2. Measure every candidate on the fitting half (select's measurements, no real runs).
    decision = settings.temperatures[0]
    select_settings = SelectSettings(
        temperatures=settings.temperatures,
        decision_temperature=decision,
        continuation_tokens=settings.max_tokens,
        max_k=settings.max_k,
        confirm=False,
        precision=settings.precision,
        device=settings.device,
        runtime=settings.runtime,
        trust_draft_vocab=settings.trust_draft_vocab,
    )
    measured = select(target, target_name, specs, fit, select_settings, on_progress=on_progress)
    curve = measured.verify_curve
    compatible = [r for r in measured.candidates if r.compatible]
    for result in measured.candidates:
        if not result.compatible:
            notes.append(f"{result.spec} left out: {'; '.join(result.problems)}")
    if not compatible:
        problems = "; ".join(f"{r.spec}: {', '.join(r.problems)}" for r in measured.candidates)
        raise IncompatibleModelsError(f"no candidate draft can pair with the target ({problems})")
    # 3. Per-position acceptance and the real step cost: a short probe run of each drafter
    # on the fitting half, interleaved with plain decoding.
    drafters: dict[str, Drafter] = {}
    for result in compatible:
        candidate = resolve_candidate(
            result.spec,
            target,
            trust_draft_vocab=settings.trust_draft_vocab,
            precision=settings.precision,
            device=settings.device,
            runtime=settings.runtime,
        )
        assert candidate.drafter is not None  # it was compatible a moment ago
        drafters[result.spec] = candidate.drafter
    probe_k = min(PROBE_K, settings.max_k)
    probes: dict[float, list[VerifiedRun]] = {}
    for temperature in settings.temperatures:
        step = f"per-position acceptance (probe runs, T={temperature:g})"

        def probed(done: int, total: int, step: str = step) -> None:
            if on_progress is not None:
                on_progress(step, done, total)

        probed(0, len(fit))
        probes[temperature] = verify_interleaved(
            target.model,
            [(spec, drafter, probe_k) for spec, drafter in drafters.items()],
            [row[2] for row in fit],
            settings.max_tokens,
            temperature=temperature,
            on_prompt=probed,
        )
    survivals = {run.label: survival_of(run, probe_k) for run in probes[decision]}
    positions = _positions(probes, [row[1] for row in fit], probe_k)
    # 4. Predict.
    predictions = [
        p
        for result in compatible
        for p in _configs(result, curve, decision, settings.max_k, survivals.get(result.spec))
    ]
    chosen = _chosen(predictions, settings.top)
    # 5. A tuned threshold policy for the best predicted drafter.
    if settings.tune_policy and chosen:
        recorded = itertools.count(1)

        def record_done() -> None:
            if on_progress is not None:
                step = f"tuning a threshold policy (recorded at K={settings.max_k})"
                on_progress(step, next(recorded), len(fit))

        try:
            tuned = _tuned(
                target, chosen[0], drafters[chosen[0].drafter], fit, curve, settings, record_done
            )
        except SpectuneError as exc:  # e.g. a drafter that never drafted on the fitting half
            notes.append(f"no threshold policy fitted for {chosen[0].drafter}: {exc}")
        else:
            predictions.append(tuned)
            chosen.append(tuned)
    # 6. Verify the chosen configurations against plain decoding, interleaved.

    def prompt_done(done: int, total: int) -> None:
        if on_progress is not None:
            on_progress("verification (interleaved with plain)", done, total)

    prompt_done(0, len(held))
    runs = verify_interleaved(
        target.model,
        [(p.label, drafters[p.drafter], p.k) for p in chosen],
        [row[2] for row in held],
        settings.max_tokens,
        policies={p.label: p.policy for p in chosen if p.policy is not None},
        on_prompt=prompt_done,
    )
    run_of = {r.label: r for r in runs}
    results = tuple(
        ConfigResult(p, run_of.get(p.label))
        for p in sorted(predictions, key=lambda p: p.predicted_speedup, reverse=True)
    )
    # 7. Judge, unless other processes' load disturbed the figures.
    verdict = decide(predictions, runs)
    load = meter.stop()
    if load.busy:
        verdict = withheld(verdict, load.line("advise"))
    rows: list[CheckRow] = []
    if runs:
        judged = run_of[verdict.winner] if verdict.winner else max(runs, key=lambda r: r.speedup)
        prediction = next(p for p in predictions if p.label == judged.label)
        rows, rule_notes = checklist(prediction, judged)
        notes.extend(rule_notes)
    return Advice(
        target=target_name,
        target_parameters=measured.target_parameters,
        verify_curve={k: curve.relative(k) for k in range(1, settings.max_k + 1)},
        settings={
            "temperatures": list(settings.temperatures),
            "max_tokens": settings.max_tokens,
            "fit_prompts": len(fit),
            "verify_prompts": len(held),
            "top": settings.top,
            "max_k": settings.max_k,
            "precision": settings.precision.name,
            "tune_policy": settings.tune_policy,
        },
        candidates=tuple(
            _check(r, survivals.get(r.spec), positions.get(r.spec, Positions()), decision)
            for r in measured.candidates
        ),
        configurations=results,
        verdict=verdict,
        checklist=tuple(rows),
        notes=tuple(notes),
        outputs={},
        seconds=time.perf_counter() - started,
        machine_load=load.as_json(),
    )
