"""Measured costs of a drafter and real speculative runs that confirm a prediction.

Draft cost c is measured through the drafter's own ``propose`` (what the engine pays per
draft token, cache syncing included) relative to one target forward over one token;
the verification curve v(K) comes from ``spectune.control.costs``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spectune.control.base import FixedK
from spectune.control.config import PolicySpec
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.base import Drafter, TargetFeatures
from spectune.models.base import LanguageModel
from spectune.records import CountsReport, SpecCounts
from spectune.sampling import SamplingParams

__all__ = ["RunMeasurement", "measure_draft_cost", "measure_runs"]


@torch.inference_mode()
def measure_draft_cost(
    drafter: Drafter,
    target: LanguageModel,
    prompt: Sequence[int],
    target_step_seconds: float,
    *,
    k: int = 4,
    repeats: int = 5,
) -> float:
    """c: median seconds per drafted token over ``target_step_seconds``."""
    prompt = list(prompt)
    cache = target.new_cache(capacity=len(prompt) + 1)
    out = target.forward(torch.tensor([prompt[:-1]]), cache, last_only=True)
    features = None if out.hidden is None else TargetFeatures(0, out.hidden[0])
    params = SamplingParams(max_tokens=k + 1)
    samples = []
    for _ in range(repeats + 1):  # the first call warms up
        drafter.reset()
        drafter.commit(prompt, features)
        drafter.propose(prompt, k, params, None)  # the sync over the prompt is not per-token
        start = time.perf_counter()
        draft = drafter.propose(prompt, k, params, None)
        elapsed = time.perf_counter() - start
        samples.append(elapsed / max(1, len(draft)))
    return statistics.median(samples[1:]) / target_step_seconds


@dataclass(frozen=True)
class RunMeasurement(CountsReport):
    """Speculative runs at one K over the confirmation prompts, pooled."""

    k: int
    counts: SpecCounts  # every step of every prompt's run

    @property
    def tokens(self) -> int:
        return self.counts.emitted

    @property
    def seconds(self) -> float:
        """Decode time (prefill excluded)."""
        return self.counts.step_time


def measure_runs(
    target: LanguageModel,
    drafter: Drafter | None,
    prompts: Sequence[list[int]],
    k: int,
    max_tokens: int,
    *,
    policy: PolicySpec | None = None,
    temperature: float = 0.0,
    seed: int = 0,
) -> RunMeasurement:
    """Speculative decoding (or plain, with ``drafter=None`` / ``k=0``) over prompts, at fixed
    ``k`` or under ``policy`` (a fresh one per prompt); greedy by default, else sampled at
    ``temperature`` with prompt i seeded ``seed + i``."""
    from spectune.control.registry import build_policy

    engine = SpeculativeEngine(target, drafter)
    counts = SpecCounts()
    for i, prompt in enumerate(prompts):
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            seed=None if temperature == 0.0 else seed + i,
        )
        chosen = (
            build_policy(policy, params=params)
            if policy is not None and drafter is not None
            else FixedK(k if drafter else 0)
        )
        generation = engine.run(prompt, params, policy=chosen)
        counts.merge(generation.counts)
    return RunMeasurement(k, counts)
