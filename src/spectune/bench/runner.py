"""Running the systems: interleaved, so the machine's drift hits every system alike.

For each dtype, temperature, prompt and repetition every system runs once, and the order
reverses on odd repetitions (A B C, C B A, ...): a machine that slows down during a run
charges every system the same. Each system first runs one short warm-up call per
temperature that is not recorded (``warm_up``; its timing gives the run-time estimate).
At temperature > 0 a prompt's seed is the same for every system and repetition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.bench.assemble import Workbench
from spectune.bench.plan import BenchPrompt
from spectune.bench.systems import CallResult, System
from spectune.sampling import SamplingParams

__all__ = [
    "Measurement",
    "Schedule",
    "estimate_seconds",
    "prompt_seed",
    "run_interleaved",
    "warm_up",
]

WARMUP_TOKENS = 8


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


def warm_up(workbench: Workbench, schedule: Schedule) -> dict[tuple[str, float], CallResult]:
    """One short untimed-for-the-results call per system and temperature (first-call costs:
    allocation, lazy initialisation). Its timing feeds the run-time estimate."""
    warm: dict[tuple[str, float], CallResult] = {}
    prompt = schedule.prompts[0].tokens
    for temperature in schedule.temperatures:
        params = SamplingParams(temperature=temperature, max_tokens=WARMUP_TOKENS)
        for system in workbench.systems:
            warm[(system.info.name, temperature)] = system.run(prompt, params, schedule.seed)
    return warm


def estimate_seconds(
    warm: dict[tuple[str, float], CallResult],
    prompts: int,
    repeats: int,
    max_tokens: int,
) -> float:
    """Rough wall time of one dtype's loop: each system's warm-up seconds per token, scaled
    to ``max_tokens`` (prefill included in the per-token cost, so it errs long)."""
    per_pass = sum(
        result.seconds * max_tokens / max(1, len(result.tokens)) for result in warm.values()
    )
    return per_pass * prompts * repeats


Listener = Callable[[Measurement], Any]


def run_interleaved(
    workbench: Workbench, schedule: Schedule, listener: Listener | None = None
) -> list[Measurement]:
    """Every system on every prompt, temperature and repetition; see the module docstring."""
    measurements: list[Measurement] = []
    systems = list(workbench.systems)
    for temperature in schedule.temperatures:
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
