"""A seeded, sampled request gives the same tokens whatever batch it lands in.

Alone, in a small batch below the speculation crossover (``speculate_max_batch``) and in
a batch above it, with a model-free drafter (n-gram: its tokens are the target's draws at
the request's position numbers, at any K) and with a draft model (whose seeded requests
keep speculating above the crossover); neighbours that finish early and join late.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from spectune.control.base import FixedK, KPolicy, StepPlan
from spectune.decode.batch import BatchEngine
from spectune.decode.engine import SpeculativeEngine
from spectune.decode.sequential import SequentialBatchEngine
from spectune.drafters import ModelDrafter, NgramDrafter
from spectune.drafters.base import Drafter, DraftSource
from spectune.drafters.batched import PerRow
from spectune.models.llama import LlamaLM
from spectune.models.toy import perturbed, toy_config, toy_model
from spectune.records import StepRecord
from spectune.sampling import SamplingParams

# Repetitive prompts, so the n-gram drafter finds matches and drafts often.
PROMPTS = {
    "a": [1, 5, 9, 13, 7, 5, 9, 13],
    "b": [1, 40, 41, 40, 41],
    "c": [1, 3, 3, 8, 21, 34, 55, 8, 21, 34],
    "d": [9, 9, 9],
    "e": [1, 22, 23, 24, 22, 23],
}
SAMPLED = {
    "T=1": SamplingParams(temperature=1.0, max_tokens=24),
    "T=0.7,top_p=0.9": SamplingParams(temperature=0.7, top_p=0.9, max_tokens=24),
}
K = 3


@pytest.fixture(scope="module")
def target() -> LlamaLM:
    """The toy target without an EOS token, so every request runs to its max_tokens."""
    config = dataclasses.replace(toy_config(), eos_token_ids=())
    return toy_model(0, config=config, scale=3.0)


@pytest.fixture(scope="module")
def draft(target: LlamaLM) -> LlamaLM:
    return perturbed(target, 0.3)


def seeded(params: SamplingParams, rid: str, **changes: int) -> SamplingParams:
    return dataclasses.replace(params, seed=1000 + sorted(PROMPTS).index(rid), **changes)


def alone(
    target: LlamaLM,
    drafter: Drafter | None,
    prompt: list[int],
    params: SamplingParams,
    policy: KPolicy | None = None,
) -> list[int]:
    return SpeculativeEngine(target, drafter).run(prompt, params, policy=policy or FixedK(K)).tokens


def run_batch(
    engine: BatchEngine | SequentialBatchEngine,
    requests: dict[str, tuple[list[int], SamplingParams]],
) -> tuple[dict[str, list[int]], dict[str, list[tuple[int, int]]]]:
    """Every request decoded, joining as rows free up: tokens per request, and per
    request its steps' (active sequences before the step, K)."""
    tokens: dict[str, list[int]] = {}
    steps: dict[str, list[tuple[int, int]]] = {}
    queue = list(requests.items())
    while queue or engine.active:
        while queue and engine.has_room:
            rid, (prompt, params) = queue.pop(0)
            engine.add(rid, prompt, params)
            tokens[rid], steps[rid] = [], []
        size = engine.active
        for update in engine.step():
            tokens[update.request_id].extend(update.record.emitted)
            steps[update.request_id].append((size, update.record.k))
    return tokens, steps


def batch(target: LlamaLM, source: DraftSource, max_batch: int, crossover: int) -> BatchEngine:
    return BatchEngine(
        target,
        source,
        max_batch=max_batch,
        speculate_max_batch=crossover,
        policy_factory=lambda params: FixedK(K),
    )


# (max_batch, speculate_max_batch): a small batch below the crossover, a full one above it.
BATCHES = {"below": (2, 4), "above": (5, 2)}


@pytest.mark.parametrize("where", sorted(BATCHES))
@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_ngram_rows_equal_alone_and_plain(target: LlamaLM, name: str, where: str) -> None:
    requests = {rid: (p, seeded(SAMPLED[name], rid)) for rid, p in PROMPTS.items()}
    got, steps = run_batch(batch(target, PerRow(NgramDrafter), *BATCHES[where]), requests)
    for rid, (prompt, params) in requests.items():
        expected = alone(target, NgramDrafter(), prompt, params)
        assert got[rid] == expected, rid
        # The strongest form: the same tokens as plain decoding with the same seed.
        assert expected == alone(target, None, prompt, params, FixedK(0)), rid
    above = [k for rows in steps.values() for size, k in rows if size > 2]
    if where == "above":  # the crossover held every row plain while the batch was large
        assert above and not any(above)
    else:  # it speculated
        assert any(k for rows in steps.values() for _, k in rows)


@pytest.mark.parametrize("where", sorted(BATCHES))
@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_model_draft_rows_equal_alone(
    target: LlamaLM, draft: LlamaLM, name: str, where: str
) -> None:
    requests = {rid: (p, seeded(SAMPLED[name], rid)) for rid, p in PROMPTS.items()}
    got, steps = run_batch(batch(target, ModelDrafter(draft), *BATCHES[where]), requests)
    for rid, (prompt, params) in requests.items():
        assert got[rid] == alone(target, ModelDrafter(draft), prompt, params), rid
    # A seeded request keeps its K above the crossover (its tokens depend on it): the
    # first steps draft K (later ones draft less only near max_tokens).
    assert all(rows[0] == (len(requests) if where == "above" else 2, K) for rows in steps.values())


def test_unseeded_rows_still_stop_speculating_above_the_crossover(
    target: LlamaLM, draft: LlamaLM
) -> None:
    requests = {rid: (p, SAMPLED["T=1"]) for rid, p in PROMPTS.items()}
    _, steps = run_batch(batch(target, ModelDrafter(draft), 5, 2), requests)
    above = [k for rows in steps.values() for size, k in rows if size > 2]
    assert above and not any(above)


@pytest.mark.parametrize(
    "source, drafter",
    [(lambda d: PerRow(NgramDrafter), lambda d: NgramDrafter()), (ModelDrafter, ModelDrafter)],
    ids=["ngram", "model"],
)
def test_neighbours_finish_early_and_join_late(
    target: LlamaLM,
    draft: LlamaLM,
    source: Callable[[LlamaLM], DraftSource],
    drafter: Callable[[LlamaLM], Drafter],
) -> None:
    """One long request ("a") among short ones that finish early while later ones join,
    the batch size crossing the crossover both ways."""
    lengths = {"a": 40, "b": 3, "c": 6, "d": 2, "e": 9}
    requests = {
        rid: (p, seeded(SAMPLED["T=0.7,top_p=0.9"], rid, max_tokens=lengths[rid]))
        for rid, p in PROMPTS.items()
    }
    got, steps = run_batch(batch(target, source(draft), 3, 1), requests)
    sizes = {size for size, _ in steps["a"]}
    assert 1 in sizes and 3 in sizes
    for rid, (prompt, params) in requests.items():
        assert got[rid] == alone(target, drafter(draft), prompt, params), rid


class Wavering:
    """K from a fixed script, as a policy driven by measured times could choose it."""

    def __init__(self, ks: list[int]) -> None:
        self.ks, self.index = ks, 0

    def plan(self) -> StepPlan:
        return StepPlan(self.ks[self.index % len(self.ks)])

    def observe(self, record: StepRecord) -> None:
        self.index += 1


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_ngram_output_does_not_depend_on_k(target: LlamaLM, name: str) -> None:
    """Any K trajectory (a cost controller's, a deadline's fallback) gives the same tokens
    with a model-free drafter, the position numbers being the request's."""
    for rid, prompt in PROMPTS.items():
        params = seeded(SAMPLED[name], rid)
        outputs = {
            str(policy.ks): alone(target, NgramDrafter(), prompt, params, policy)
            for policy in (Wavering([0]), Wavering([1]), Wavering([5]), Wavering([4, 0, 2, 1]))
        }
        assert len(set(map(tuple, outputs.values()))) == 1, (rid, outputs)


def test_sequential_engine_above_the_crossover(target: LlamaLM, draft: LlamaLM) -> None:
    requests = {rid: (p, seeded(SAMPLED["T=1"], rid)) for rid, p in PROMPTS.items()}
    engine = SequentialBatchEngine(
        target,
        lambda: ModelDrafter(draft),
        max_batch=5,
        speculate_max_batch=2,
        policy_factory=lambda params: FixedK(K),
    )
    got, _ = run_batch(engine, requests)
    for rid, (prompt, params) in requests.items():
        assert got[rid] == alone(target, ModelDrafter(draft), prompt, params), rid


def test_the_seed_decides_the_tokens(target: LlamaLM) -> None:
    """Not a constant stream: other seeds give other tokens (the test above could pass
    with a request that ignores its seed)."""
    prompt = PROMPTS["a"]
    outputs = {
        tuple(alone(target, NgramDrafter(), prompt, dataclasses.replace(SAMPLED["T=1"], seed=s)))
        for s in range(4)
    }
    assert len(outputs) == 4
    generator = torch.Generator().manual_seed(5)
    unseeded = SpeculativeEngine(target, NgramDrafter()).run(
        prompt, SAMPLED["T=1"], policy=FixedK(K), generator=generator
    )
    assert len(unseeded.tokens) == SAMPLED["T=1"].max_tokens
