"""Batch throughput with and without speculation, and the crossover between them.

At batch size B every step forwards B rows; speculation multiplies the target's tokens
per step by K + 1 and adds a batched draft pass per draft token. At small B the target's
forward is bound by reading its weights and the extra tokens are nearly free; at large B
it becomes compute bound and verification's extra tokens cost their full price, so
speculation stops paying (what vLLM and SGLang users report). The crossover is the
largest measured B at which speculation is still faster at that size and every smaller
one; ``save_crossover`` records it for ``BatchEngine``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from spectune.control.base import FixedK
from spectune.decode.batch import BatchEngine
from spectune.experiments.common import Setup
from spectune.sampling import SamplingParams

__all__ = ["BatchPoint", "batch_sweep", "batch_throughput", "best_speculative", "crossover"]


@dataclass(frozen=True)
class BatchPoint:
    batch: int
    k: int  # draft tokens per step (0: plain decoding)
    tokens: int  # generated over all sequences
    steps: int
    seconds: float  # wall time of the decode steps (prefills excluded)

    @property
    def speculative(self) -> bool:
        return self.k > 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "batch": self.batch,
            "k": self.k,
            "speculative": self.speculative,
            "tokens": self.tokens,
            "steps": self.steps,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
        }


def batch_throughput(
    setup: Setup,
    batch: int,
    *,
    k: int,
    max_tokens: int = 32,
    temperature: float = 0.0,
) -> BatchPoint:
    """Decode ``batch`` prompts together (cycling through the set) with ``k`` draft tokens
    per step (0: plain) and time the steps."""
    engine = BatchEngine(
        setup.target,
        setup.batch_draft() if k > 0 else None,
        max_batch=batch,
        speculate_max_batch=batch,  # measure speculation itself, whatever was recorded
        policy_factory=lambda p: FixedK(k),
    )
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=0)
    for i in range(batch):
        _, prompt = setup.prompts[i % len(setup.prompts)]
        engine.add(f"seq-{i}", list(prompt), params)
    tokens = steps = 0
    start = time.perf_counter()
    while engine.active:
        updates = engine.step()
        steps += 1
        tokens += sum(len(u.record.emitted) for u in updates)
    return BatchPoint(batch, k, tokens, steps, time.perf_counter() - start)


def best_speculative(points: Sequence[BatchPoint], size: int) -> BatchPoint | None:
    """The fastest speculative point at batch size ``size`` (over the K measured)."""
    spec = [p for p in points if p.batch == size and p.speculative]
    return max(spec, key=lambda p: p.tokens_per_second) if spec else None


def crossover(points: Sequence[BatchPoint]) -> int:
    """Largest batch size B such that speculation (at its best measured K) was faster at
    every measured size <= B (0: speculation never paid)."""
    sizes = sorted({p.batch for p in points})
    best = 0
    for size in sizes:
        spec = best_speculative(points, size)
        plain = [p for p in points if p.batch == size and not p.speculative]
        if spec is None or not plain or spec.tokens_per_second <= plain[0].tokens_per_second:
            break
        best = size
    return best


def batch_sweep(
    setup: Setup,
    sizes: Sequence[int] = (1, 2, 4, 8, 16),
    *,
    ks: Sequence[int] = (1, 4),
    max_tokens: int = 32,
    temperature: float = 0.0,
    repeats: int = 1,
) -> list[BatchPoint]:
    """Plain and every K at every size; they alternate so machine drift hits all of them.
    With ``repeats`` > 1 each size runs that many rounds of all its configurations, and a
    configuration keeps its median-throughput run."""
    points: list[BatchPoint] = []
    for size in sizes:
        runs: dict[int, list[BatchPoint]] = {k: [] for k in (0, *ks)}
        for _ in range(repeats):
            for k in runs:
                runs[k].append(
                    batch_throughput(
                        setup, size, k=k, max_tokens=max_tokens, temperature=temperature
                    )
                )
        for measured in runs.values():
            ranked = sorted(measured, key=lambda p: p.tokens_per_second)
            points.append(ranked[len(ranked) // 2])
    return points
