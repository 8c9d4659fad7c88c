"""Record a workload for ``spectune.control.tune``: decode prompts at one fixed K and keep
every step. A fixed K at the top of the searched range tells the replay every position a
smaller or adaptive K could have tested (``spectune.control.workload``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spectune.control.base import FixedK
from spectune.control.workload import RecordedRequest
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.base import Drafter
from spectune.models.base import LanguageModel
from spectune.monitor.hub import Monitor
from spectune.sampling import SamplingParams

__all__ = ["record_fixed_k"]


def record_fixed_k(
    target: LanguageModel,
    drafter: Drafter,
    prompts: Sequence[tuple[str, Sequence[int]]],  # (id, prompt tokens)
    k: int,
    max_tokens: int,
    temperatures: Sequence[float],
    *,
    seed: int = 0,
    monitor: Monitor | None = None,
    on_request: Callable[[], None] | None = None,
) -> list[RecordedRequest]:
    """Every prompt at every temperature, at fixed ``k``; the seed of prompt ``i`` is the
    benchmark's (``spectune.bench.runner.prompt_seed``), so runs are repeatable."""
    from spectune.bench.runner import prompt_seed

    engine = SpeculativeEngine(target, drafter)
    monitor = monitor or Monitor()
    requests = []
    for temperature in temperatures:
        for index, (prompt_id, tokens) in enumerate(prompts):
            params = SamplingParams(
                temperature=temperature, max_tokens=max_tokens, seed=prompt_seed(seed, index)
            )
            watch = monitor.request(info={"temperature": temperature, "prompt": prompt_id})
            records = engine.generate(list(tokens), params, policy=FixedK(k))
            requests.append(RecordedRequest(temperature, tuple(watch.watch(records))))
            if on_request is not None:
                on_request()
    return requests
