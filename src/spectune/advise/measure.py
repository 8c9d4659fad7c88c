"""Interleaved verification runs: each configuration against plain decoding, prompt by prompt.

For every held-apart prompt, plain decoding and then each configuration run back to back, so
slow drift of a shared machine hits every configuration alike (the benchmark's rule). A
configuration's measured speedup is its pooled tokens/s over plain's pooled tokens/s; its
noise is twice the standard error of the per-prompt ratios (about a 95% interval).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spectune.control.config import PolicySpec
from spectune.drafters.base import Drafter
from spectune.models.base import LanguageModel
from spectune.records import SpecCounts
from spectune.select.measure import measure_runs

__all__ = [
    "Survival",
    "VerifiedRun",
    "conditional",
    "kept_positions",
    "noise_of",
    "survival_of",
    "verify_interleaved",
]


@dataclass(frozen=True)
class Survival:
    """Per-position acceptance and the real step cost from a probe run at one K (greedy)."""

    k: int
    kept: tuple[float, ...]  # [j]: drafting steps that kept positions 1..j+1 / drafting steps
    coverage: float  # drafting steps / all steps
    step_cost: float  # mean step time over plain decoding's mean step time, beside it

    @property
    def conditional(self) -> tuple[float, ...]:
        """[j]: position j+1 kept, given positions 1..j were."""
        return conditional(self.kept)


def kept_positions(counts: SpecCounts, k: int) -> tuple[float, ...]:
    """[j]: drafting steps that kept positions 1..j+1 over drafting steps, for runs at ``k``
    (empty where nothing was drafted)."""
    drafting = counts.tested_at[0] if counts.tested_at else 0
    accepted = counts.accepted_at + [0] * (k - len(counts.accepted_at))
    return tuple(accepted[j] / drafting for j in range(k)) if drafting else ()


def conditional(kept: Sequence[float]) -> tuple[float, ...]:
    """[j]: position j+1 kept, given positions 1..j were, from a survival curve."""
    before = (1.0, *kept[:-1])
    return tuple(x / b if b > 0 else 0.0 for x, b in zip(kept, before, strict=True))


def survival_of(run: VerifiedRun, k: int) -> Survival:
    """The survival curve and step cost of a probe ``run`` at ``k``."""
    counts, plain = run.counts, run.plain
    drafting = counts.tested_at[0] if counts.tested_at else 0
    step = counts.step_time / counts.steps if counts.steps else 0.0
    plain_step = plain.step_time / plain.steps if plain.steps else 0.0
    return Survival(
        k,
        kept_positions(counts, k),
        drafting / counts.steps if counts.steps else 0.0,
        step / plain_step if plain_step > 0 else 0.0,
    )


def noise_of(ratios: Sequence[float]) -> float:
    """Twice the standard error of per-prompt speedup ratios (0 with fewer than 2): about a
    95% interval around their mean."""
    if len(ratios) < 2:
        return 0.0
    return 2.0 * statistics.stdev(ratios) / math.sqrt(len(ratios))


@dataclass(frozen=True)
class VerifiedRun:
    label: str
    counts: SpecCounts  # pooled over the prompts
    plain: SpecCounts  # the plain runs beside it, pooled
    ratios: tuple[float, ...]  # per prompt: this run's tokens/s over plain's
    per_prompt: tuple[SpecCounts, ...] = ()  # this run's counts, prompt by prompt

    @property
    def speedup(self) -> float:
        mine, plain = self.counts.tokens_per_second, self.plain.tokens_per_second
        return 0.0 if not mine or not plain else mine / plain

    @property
    def noise(self) -> float:
        """Twice the standard error of the per-prompt ratios (``noise_of``)."""
        return noise_of(self.ratios)


def verify_interleaved(
    target: LanguageModel,
    configs: Sequence[tuple[str, Drafter, int]],  # (label, drafter, K)
    prompts: Sequence[list[int]],
    max_tokens: int,
    *,
    policies: Mapping[str, PolicySpec] | None = None,  # label -> a policy instead of fixed K
    temperature: float = 0.0,
    on_prompt: Callable[[int, int], None] | None = None,
) -> list[VerifiedRun]:
    """Run plain decoding and every configuration on each prompt in turn: greedy by default,
    else sampled at ``temperature`` with prompt i seeded i in every run."""
    policies = policies or {}
    if prompts:  # warm-up at every configuration, not counted
        measure_runs(target, None, prompts[:1], 0, 4)
        for label, drafter, k in configs:
            measure_runs(target, drafter, prompts[:1], k, 4, policy=policies.get(label))
    counts = [SpecCounts() for _ in configs]
    plain_total = SpecCounts()
    ratios: list[list[float]] = [[] for _ in configs]
    per_prompt: list[list[SpecCounts]] = [[] for _ in configs]
    for i, prompt in enumerate(prompts):
        plain = measure_runs(
            target, None, [prompt], 0, max_tokens, temperature=temperature, seed=i
        ).counts
        plain_total.merge(plain)
        for j, (label, drafter, k) in enumerate(configs):
            run = measure_runs(
                target,
                drafter,
                [prompt],
                k,
                max_tokens,
                policy=policies.get(label),
                temperature=temperature,
                seed=i,
            ).counts
            counts[j].merge(run)
            per_prompt[j].append(run)
            if run.tokens_per_second and plain.tokens_per_second:
                ratios[j].append(run.tokens_per_second / plain.tokens_per_second)
        if on_prompt is not None:
            on_prompt(i + 1, len(prompts))
    return [
        VerifiedRun(label, counts[j], plain_total, tuple(ratios[j]), tuple(per_prompt[j]))
        for j, (label, _, _) in enumerate(configs)
    ]
