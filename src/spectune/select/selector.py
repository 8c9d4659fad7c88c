"""``spectune select``: which draft, and which K, for this target on this machine.

Steps, per the issue: (1) compatibility, (2) size band, (3) expected acceptance alpha from
one teacher-forced pass per continuation, (4) measured costs c and v(K), (5) the analytic
optimum K and speedup S(K) = (1 - a^(K+1)) / ((1 - a)(K c + v(K))), (6) a confirmation run
of real speculative decoding, then a ranking and a recommendation with its reasons.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from spectune.control.costs import (
    CostCurve,
    measure_forward_curve,
    predicted_speedup,
)
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.hybrid import HybridDrafter
from spectune.drafters.pairing import Loaded
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.quant import PRECISIONS, Precision
from spectune.records import validate_k
from spectune.select.alpha import (
    AlphaEstimate,
    Continuation,
    estimate_alpha,
    make_continuations,
    restate,
)
from spectune.select.candidates import Candidate, SizeBand, resolve_candidate, size_band
from spectune.select.measure import RunMeasurement, measure_draft_cost, measure_runs

__all__ = ["CandidateResult", "Recommendation", "SelectSettings", "SelectionReport", "select"]

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass(frozen=True)
class SelectSettings:
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    decision_temperature: float = 0.0  # the alpha that K and the prediction use
    continuation_tokens: int = 48
    confirm_prompts: int = 6
    confirm_tokens: int = 48
    max_k: int = 8
    extra_ks: tuple[int, ...] = ()  # also run these K, for the predicted-vs-measured plot
    confirm: bool = True
    # How candidate draft models run: the target's precision and device (the target is
    # loaded by the caller with the same ones).
    precision: Precision = PRECISIONS["fp32"]
    device: torch.device = torch.device("cpu")
    runtime: str = "auto"  # candidate draft models' runtime (the target's: --runtime)
    trust_draft_vocab: bool = False  # pair drafts without a tokenizer (spectune.drafters.pairing)
    prompt_format: str = "chat:model"  # how the prompts were encoded (PromptEncoding.format)

    def __post_init__(self) -> None:
        for k in (self.max_k, *self.extra_ks):
            validate_k(k)
        for name in ("continuation_tokens", "confirm_prompts", "confirm_tokens"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class CandidateResult:
    spec: str
    kind: str
    problems: tuple[str, ...]
    num_parameters: int | None
    size: SizeBand
    alpha: tuple[AlphaEstimate, ...] = ()
    draft_cost: float | None = None
    best_k: int = 0
    predicted_speedup: float | None = None
    predicted_curve: dict[int, float] = field(default_factory=dict)  # K -> S(K)
    runs: dict[int, RunMeasurement] = field(default_factory=dict)  # K -> measured run
    measured_speedup: dict[int, float] = field(default_factory=dict)  # K -> measured S

    @property
    def compatible(self) -> bool:
        return not self.problems

    def alpha_at(self, temperature: float) -> float | None:
        for estimate in self.alpha:
            if estimate.temperature == temperature:
                return estimate.overall
        return None

    @property
    def score(self) -> float:
        """Ranking key: the predicted speedup at the best K. The prediction rests on an exact
        alpha and median costs; a confirmation run over a few prompts is noisier, so it
        confirms (and can veto, see ``_recommend``) rather than ranks."""
        if not self.compatible:
            return -1.0
        return self.predicted_speedup or 0.0

    @property
    def confirmed_speedup(self) -> float | None:
        return self.measured_speedup.get(self.best_k)


@dataclass(frozen=True)
class Recommendation:
    draft: str  # a candidate spec, or "none" when no candidate beats plain decoding
    k: int
    predicted_speedup: float | None
    measured_speedup: float | None
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class SelectionReport:
    target: str
    target_parameters: int
    prompts: int
    continuation_positions: int
    verify_curve: CostCurve
    baseline_tokens_per_second: float | None
    candidates: tuple[CandidateResult, ...]  # ranked, incompatible ones last
    recommendation: Recommendation
    seconds: float
    settings: SelectSettings


def _evaluate(
    candidate: Candidate,
    target: Loaded,
    continuations: Sequence[Continuation],
    curve: CostCurve,
    settings: SelectSettings,
    confirm_prompts: Sequence[list[int]],
    baseline: RunMeasurement | None,
) -> CandidateResult:
    band = size_band(candidate.num_parameters, target.model.info.num_parameters)
    drafter = candidate.drafter
    if drafter is None or candidate.problems:
        return CandidateResult(
            candidate.spec, candidate.kind, candidate.problems, candidate.num_parameters, band
        )
    head = drafter.model if isinstance(drafter, HybridDrafter) else drafter
    if isinstance(head, FeatureDrafter) and isinstance(target.model, LlamaLM):
        # A target serves one feature head at a time: candidates are scored one after the
        # other, so each gets its own layers, and the states are re-recorded for them.
        target.model.feature_layers = head.head.cfg.feature_layers
        if continuations and continuations[0].hidden.shape[-1] != head.head.cfg.state_size:
            continuations = restate(target.model, continuations)
    alpha = tuple(estimate_alpha(drafter, continuations, target.model, settings.temperatures))
    chosen = next((a for a in alpha if a.temperature == settings.decision_temperature), alpha[0])
    decision, coverage = chosen.overall, chosen.coverage
    prompt = list(continuations[0].tokens[: continuations[0].prompt_length])
    cost = measure_draft_cost(drafter, target.model, prompt, curve.seconds[0])
    # The best K >= 1 even when none beats plain decoding (optimal_k would then say 0):
    # ranking needs a speedup for every candidate; "not worth it" is the recommendation's
    # verdict to make.
    ks_all = range(1, settings.max_k + 1)
    predicted = {k: _speedup(decision, coverage, cost, curve, k) for k in ks_all}
    best_k = max(predicted, key=lambda k: predicted[k])
    best = predicted[best_k]
    runs: dict[int, RunMeasurement] = {}
    measured: dict[int, float] = {}
    if settings.confirm and baseline is not None:
        ks = sorted({best_k, *settings.extra_ks})
        for k in ks:
            run = measure_runs(target.model, drafter, confirm_prompts, k, settings.confirm_tokens)
            runs[k] = run
            if baseline.tokens_per_second > 0:
                measured[k] = run.tokens_per_second / baseline.tokens_per_second
    return CandidateResult(
        candidate.spec,
        candidate.kind,
        (),
        candidate.num_parameters,
        band,
        alpha,
        cost,
        best_k,
        best,
        predicted,
        runs,
        measured,
    )


def _speedup(alpha: float, coverage: float, cost: float, curve: CostCurve, k: int) -> float:
    """S(K) for a drafter that proposes at a fraction ``coverage`` of steps; the other steps
    are plain steps (one token for one target forward). coverage = 1 is the seed's S(K)."""
    return predicted_speedup(alpha, cost, curve, k, coverage=min(1.0, coverage))


def _recommend(ranked: Sequence[CandidateResult]) -> Recommendation:
    usable = [c for c in ranked if c.compatible]
    # A candidate qualifies when it is predicted to beat plain decoding and the real run,
    # if one was made, agrees.
    qualified = [
        c
        for c in usable
        if c.score > 1.0 and (c.confirmed_speedup is None or c.confirmed_speedup > 1.0)
    ]
    if not qualified:
        return Recommendation(
            "none",
            0,
            None,
            None,
            ("no compatible candidate beats plain decoding on this machine",),
        )
    best = qualified[0]
    k = best.best_k
    measured = best.confirmed_speedup
    alpha0 = best.alpha_at(0.0)
    reasons = [
        f"highest predicted speedup {best.score:.2f}x at K={k}"
        + ("" if measured is None else f", confirmed by a real run at {measured:.2f}x"),
    ]
    if alpha0 is not None and best.draft_cost is not None:
        reasons.append(f"greedy acceptance {alpha0:.2f} at draft cost c={best.draft_cost:.3f}")
    if best.size.warning:
        reasons.append(f"size: {best.size.warning}")
    elif best.size.ratio is not None:
        reasons.append(f"size ratio 1/{1 / best.size.ratio:.0f} ({best.size.verdict})")
    others = [c for c in usable if c is not best]
    if others:
        runner = others[0]
        reasons.append(f"ahead of {runner.spec} (predicted {runner.score:.2f}x)")
    return Recommendation(best.spec, k, best.predicted_speedup, measured, tuple(reasons))


def select(
    target: Loaded,
    target_name: str,
    specs: Sequence[str],
    prompts: Sequence[tuple[str, str, list[int]]],  # (id, category, prompt tokens)
    settings: SelectSettings,
    *,
    on_progress: Progress | None = None,
) -> SelectionReport:
    started = time.perf_counter()

    def progress(stage: str, done: int, total: int) -> None:
        if on_progress:
            on_progress(stage, done, total)

    model = target.model
    progress("target continuations", 0, len(prompts))
    continuations: list[Continuation] = []
    for i, prompt in enumerate(prompts):
        continuations.extend(make_continuations(model, [prompt], settings.continuation_tokens))
        progress("target continuations", i + 1, len(prompts))
    if not continuations:
        raise ValueError("the target produced no continuation for any prompt")
    curve = measure_forward_curve(model, sizes=tuple(range(1, settings.max_k + 2)))
    confirm_prompts = _spread(continuations, settings.confirm_prompts)
    baseline = (
        measure_runs(model, None, confirm_prompts, 0, settings.confirm_tokens)
        if settings.confirm
        else None
    )
    results: list[CandidateResult] = []
    for i, spec in enumerate(specs):
        progress("candidates", i, len(specs))
        candidate = resolve_candidate(
            spec,
            target,
            trust_draft_vocab=settings.trust_draft_vocab,
            precision=settings.precision,
            device=settings.device,
            runtime=settings.runtime,
        )
        results.append(
            _evaluate(candidate, target, continuations, curve, settings, confirm_prompts, baseline)
        )
    progress("candidates", len(specs), len(specs))
    ranked = sorted(results, key=lambda r: r.score, reverse=True)
    return SelectionReport(
        target=target_name,
        target_parameters=model.info.num_parameters,
        prompts=len(continuations),
        continuation_positions=sum(len(c.scored) for c in continuations),
        verify_curve=curve,
        baseline_tokens_per_second=None if baseline is None else baseline.tokens_per_second,
        candidates=tuple(ranked),
        recommendation=_recommend(ranked),
        seconds=time.perf_counter() - started,
        settings=settings,
    )


def _spread(continuations: Sequence[Continuation], count: int) -> list[list[int]]:
    """Up to ``count`` prompts, round-robin over categories (every category is confirmed)."""
    by_category: dict[str, list[Continuation]] = {}
    for item in continuations:
        by_category.setdefault(item.category, []).append(item)
    chosen: list[list[int]] = []
    round_index = 0
    while len(chosen) < count and any(round_index < len(v) for v in by_category.values()):
        for items in by_category.values():
            if round_index < len(items) and len(chosen) < count:
                chosen.append(list(items[round_index].tokens[: items[round_index].prompt_length]))
        round_index += 1
    return chosen
