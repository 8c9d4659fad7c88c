"""Running the systems: interleaved, so the machine's drift hits every system alike.

For each dtype, temperature, prompt and repetition every system runs once, and the order
reverses on odd repetitions (A B C, C B A, ...): a machine that slows down during a run
charges every system the same. Each system first runs one short warm-up call that is not
recorded. At temperature > 0 a prompt's seed is the same for every system and repetition.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.bench.assemble import Workbench
from spectune.bench.plan import BenchPrompt
from spectune.bench.systems import CallResult, System, SystemInfo
from spectune.costs import CostCurve, measure_forward_curve
from spectune.sampling import SamplingParams

__all__ = [
    "CURVE_SIZES",
    "Measurement",
    "Schedule",
    "estimate_seconds",
    "measure_curves",
    "prompt_seed",
    "run_interleaved",
]

CURVE_SIZES = (1, 2, 4, 8, 16)  # tokens per forward in the reported verification-cost curve
WARMUP_TOKENS = 4

# Rough cost of one call relative to spectune plain decoding, for the up-front estimate
# only (speculation can be faster or much slower; transformers' loop has more overhead).
_ESTIMATE_FACTOR = {
    "spectune-plain": 1.0,
    "spectune": 1.2,
    "hf-generate": 1.4,
    "hf-assisted": 2.0,
    "hf-lookup": 1.4,
}


@dataclass(frozen=True)
class Measurement:
    """One timed call: every raw number the summary is computed from."""

    system: str
    dtype: str
    temperature: float
    prompt_id: str
    category: str
    repeat: int
    seed: int
    result: CallResult


@dataclass(frozen=True)
class Schedule:
    """The loop's shape, after any budget trimming."""

    prompts: tuple[BenchPrompt, ...]
    temperatures: tuple[float, ...]
    repeats: int
    max_tokens: int
    seed: int

    @property
    def calls_per_system(self) -> int:
        return len(self.prompts) * len(self.temperatures) * self.repeats


def prompt_seed(base: int, index: int) -> int:
    """The fixed seed of prompt ``index`` (shared by every system and repetition)."""
    return base * 100_003 + index


def measure_curves(workbench: Workbench, *, repeats: int = 5) -> dict[str, CostCurve]:
    """Verification-cost curves of the target in spectune's runtime and, if loaded, through
    transformers (``spectune.models.hf`` wraps the same transformers model)."""
    curves = {"spectune": measure_forward_curve(workbench.target, CURVE_SIZES, repeats=repeats)}
    if workbench.hf_target is not None:
        from spectune.models.hf import HFModel

        hf = HFModel(workbench.hf_target, name="hf")
        curves["hf"] = measure_forward_curve(hf, CURVE_SIZES, repeats=repeats)
    return curves


def estimate_seconds(
    systems: Sequence[SystemInfo],
    curve: CostCurve,
    prompts: Sequence[BenchPrompt],
    temperatures: int,
    repeats: int,
    max_tokens: int,
) -> float:
    """Rough wall time of one dtype's loop, from the target's measured forward times."""
    step = curve.seconds[0]
    per_pass = 0.0
    for prompt in prompts:
        plain_call = curve.time(len(prompt.tokens)) + max_tokens * step
        per_pass += sum(plain_call * _ESTIMATE_FACTOR[s.family] for s in systems)
    warmup = sum(
        (curve.time(len(prompts[0].tokens)) + WARMUP_TOKENS * step) * _ESTIMATE_FACTOR[s.family]
        for s in systems
    )
    return per_pass * temperatures * repeats + warmup * temperatures


Listener = Callable[[Measurement], Any]


def run_interleaved(
    workbench: Workbench, schedule: Schedule, listener: Listener | None = None
) -> list[Measurement]:
    """Every system on every prompt, temperature and repetition; see the module docstring."""
    measurements: list[Measurement] = []
    systems = list(workbench.systems)
    for temperature in schedule.temperatures:
        warm = SamplingParams(temperature=temperature, max_tokens=WARMUP_TOKENS)
        for system in systems:
            system.run(schedule.prompts[0].tokens, warm, schedule.seed)
        params = SamplingParams(temperature=temperature, max_tokens=schedule.max_tokens)
        for index, prompt in enumerate(schedule.prompts):
            seed = prompt_seed(schedule.seed, index)
            for repeat in range(schedule.repeats):
                order: Sequence[System] = systems if repeat % 2 == 0 else systems[::-1]
                for system in order:
                    result = system.run(prompt.tokens, params, seed)
                    measurement = Measurement(
                        system=system.info.name,
                        dtype=workbench.dtype,
                        temperature=temperature,
                        prompt_id=prompt.id,
                        category=prompt.category,
                        repeat=repeat,
                        seed=seed,
                        result=result,
                    )
                    measurements.append(measurement)
                    if listener is not None:
                        listener(measurement)
    return measurements


def elapsed(start: float) -> float:
    return time.perf_counter() - start
