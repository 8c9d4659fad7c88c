"""Batched decoding equals decoding each sequence alone (ragged lengths, join and leave)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from spectune.control.base import FixedK
from spectune.decode.batch import BatchEngine, SequenceUpdate
from spectune.decode.engine import SpeculativeEngine
from spectune.decode.sequential import SequentialBatchEngine
from spectune.drafters import FailingDrafter, ModelDrafter, NgramDrafter, ScriptedDrafter
from spectune.drafters.base import Drafter
from spectune.drafters.batched import PerRow
from spectune.drafters.feature import FeatureDrafter, FeatureRows
from spectune.errors import BatchFullError, InvalidParameterError, PromptError
from spectune.models.llama import LlamaLM
from spectune.models.toy import perturbed, toy_config, toy_model
from spectune.records import StepRecord
from spectune.sampling import SamplingParams
from test_engine import ShadowOnly

PROMPTS = {
    "a": [1, 5, 9, 13, 7],
    "b": [1, 40],
    "c": [1, 3, 3, 8, 21, 34, 55, 8, 13, 4, 17],
    "d": [9],
    "e": [1, 22, 23, 24, 25, 26, 27],
}


@pytest.fixture(scope="module")
def endless() -> LlamaLM:
    """The toy target without an EOS token, so sequences run to max_tokens."""
    config = dataclasses.replace(toy_config(), eos_token_ids=())
    return toy_model(0, config=config, scale=3.0)


@pytest.fixture(scope="module")
def endless_draft(endless: LlamaLM) -> LlamaLM:
    return perturbed(endless, 0.3)


def run_batch(
    engine: BatchEngine,
    pending: dict[str, tuple[list[int], SamplingParams]],
    *,
    seeds: dict[str, int] | None = None,
) -> dict[str, list[StepRecord]]:
    records: dict[str, list[StepRecord]] = {}
    queue = list(pending.items())
    while queue or engine.active:
        while queue and engine.has_room:
            rid, (prompt, params) = queue.pop(0)
            gen = torch.Generator().manual_seed(seeds[rid]) if seeds else None
            engine.add(rid, prompt, params, generator=gen)
            records[rid] = []
        for update in engine.step():
            records[update.request_id].append(update.record)
    return records


def tokens_of(records: list[StepRecord]) -> list[int]:
    return [t for r in records for t in r.emitted]


def counts(record: StepRecord) -> tuple[object, ...]:
    """A record without its times and its verification memory (a batch's step times and
    verification pass are the whole batch's)."""
    return dataclasses.astuple(
        dataclasses.replace(
            record,
            index=0,
            draft_time=0.0,
            target_time=0.0,
            step_time=0.0,
            verify_peak_bytes=None,
        )
    )


def alone(
    target: LlamaLM,
    drafter: Drafter | None,
    prompt: list[int],
    params: SamplingParams,
    k: int,
    seed: int | None = None,
) -> list[int]:
    engine = SpeculativeEngine(target, drafter)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return engine.run(prompt, params, policy=FixedK(k), generator=gen).tokens


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_greedy_batch_equals_alone_with_draft_model(
    endless: LlamaLM, endless_draft: LlamaLM, k: int
) -> None:
    toy_target, toy_draft = endless, endless_draft
    params = SamplingParams(max_tokens=24)
    engine = BatchEngine(
        toy_target,
        ModelDrafter(toy_draft),
        max_batch=3,
        capacity=256,
        policy_factory=lambda p: FixedK(k),
    )
    got = run_batch(engine, {rid: (p, params) for rid, p in PROMPTS.items()})
    for rid, prompt in PROMPTS.items():
        expected = alone(toy_target, ModelDrafter(toy_draft), prompt, params, k)
        assert tokens_of(got[rid]) == expected, rid
        assert expected == alone(toy_target, None, prompt, params, 0)  # lossless
        assert all(r.k <= k for r in got[rid])
    steps = [r for records in got.values() for r in records]
    if k:  # the draft is right sometimes and wrong sometimes: both paths ran
        assert 0 < sum(r.accepted for r in steps) < sum(r.num_draft_tokens for r in steps)
    assert engine.active == 0


@pytest.mark.parametrize("eos", [True, False])
def test_sampled_batch_equals_alone_with_per_sequence_streams(
    request: pytest.FixtureRequest, eos: bool
) -> None:
    """Each sequence draws from its own generator in the single engine's order, so with the
    same seeds the batched output is the same sample, token for token."""
    toy_target = request.getfixturevalue("toy_target" if eos else "endless")
    toy_draft = request.getfixturevalue("toy_draft" if eos else "endless_draft")
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=20)
    seeds = {rid: 100 + i for i, rid in enumerate(PROMPTS)}
    engine = BatchEngine(
        toy_target,
        ModelDrafter(toy_draft),
        max_batch=4,
        capacity=256,
        policy_factory=lambda p: FixedK(3),
    )
    got = run_batch(engine, {rid: (p, params) for rid, p in PROMPTS.items()}, seeds=seeds)
    for rid, prompt in PROMPTS.items():
        expected = alone(toy_target, ModelDrafter(toy_draft), prompt, params, 3, seeds[rid])
        assert tokens_of(got[rid]) == expected, rid


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_ngram_batch_equals_alone(toy_target: LlamaLM, temperature: float) -> None:
    params = SamplingParams(temperature=temperature, max_tokens=16)
    seeds = {rid: 7 + i for i, rid in enumerate(PROMPTS)}
    engine = BatchEngine(
        toy_target, PerRow(NgramDrafter), max_batch=5, policy_factory=lambda p: FixedK(4)
    )
    got = run_batch(engine, {rid: (p, params) for rid, p in PROMPTS.items()}, seeds=seeds)
    for rid, prompt in PROMPTS.items():
        assert tokens_of(got[rid]) == alone(
            toy_target, NgramDrafter(), prompt, params, 4, seeds[rid]
        )


def test_join_and_leave_mid_run(endless: LlamaLM, endless_draft: LlamaLM) -> None:
    toy_target, toy_draft = endless, endless_draft
    params = SamplingParams(max_tokens=30)
    short = SamplingParams(max_tokens=5)
    engine = BatchEngine(
        toy_target, ModelDrafter(toy_draft), max_batch=3, policy_factory=lambda p: FixedK(2)
    )
    out: dict[str, list[int]] = {rid: [] for rid in ("a", "b", "c", "d")}

    def collect() -> None:
        for update in engine.step():
            out[update.request_id].extend(update.record.emitted)

    engine.add("a", PROMPTS["a"], params)
    engine.add("b", PROMPTS["b"], short)
    collect()
    engine.add("c", PROMPTS["c"], params)
    assert not engine.has_room
    with pytest.raises(BatchFullError):
        engine.add("d", PROMPTS["d"], params)
    for _ in range(6):
        collect()
    assert engine.active == 2  # "b" finished after 5 tokens and left
    assert set(engine.request_ids) == {"a", "c"}
    engine.cancel("a")  # row 0 leaves: "c" moves into it
    engine.cancel("a")  # cancelling twice (or an unknown id) is harmless
    engine.cancel("nobody")
    engine.add("d", PROMPTS["d"], params)
    while engine.active:
        collect()
    for rid, p in (("b", short), ("c", params), ("d", params)):
        assert out[rid] == alone(toy_target, None, PROMPTS[rid], p, 0), rid
    full_a = alone(toy_target, None, PROMPTS["a"], params, 0)
    assert out["a"] == full_a[: len(out["a"])] and 0 < len(out["a"]) < len(full_a)


def test_speculation_turns_off_above_the_crossover(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    params = SamplingParams(max_tokens=6)
    engine = BatchEngine(
        toy_target,
        ModelDrafter(toy_draft),
        max_batch=4,
        speculate_max_batch=2,
        policy_factory=lambda p: FixedK(3),
    )
    for rid in ("a", "b", "c"):
        engine.add(rid, PROMPTS[rid], params)
    updates = engine.step()
    assert all(u.record.k == 0 and u.record.num_draft_tokens == 0 for u in updates)
    assert all((u.record.fallback or "").startswith("batch_too_large") for u in updates)
    engine.cancel("c")
    assert all(u.record.k == 3 for u in engine.step())


@pytest.mark.parametrize(
    "factory",
    [
        lambda: FailingDrafter("raise", vocab_size=64, after=1),
        lambda: FailingDrafter("nan", vocab_size=64),
        lambda: FailingDrafter("oov", vocab_size=64),
    ],
)
def test_drafter_failure_falls_back_for_that_sequence(
    toy_target: LlamaLM, factory: Callable[[], Drafter]
) -> None:
    params = SamplingParams(max_tokens=12)
    engine = BatchEngine(
        toy_target, PerRow(factory), max_batch=2, policy_factory=lambda p: FixedK(3)
    )
    got = run_batch(engine, {rid: (PROMPTS[rid], params) for rid in ("a", "c")})
    for rid in ("a", "c"):
        assert tokens_of(got[rid]) == alone(toy_target, None, PROMPTS[rid], params, 0)
        assert any((r.fallback or "").startswith("drafter_error") for r in got[rid])


def test_draft_model_that_raises_falls_back(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    class Broken(LlamaLM):
        calls = 0

        def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            Broken.calls += 1
            if Broken.calls > 2:
                raise RuntimeError("out of memory")
            return super().forward(*args, **kwargs)

    params = SamplingParams(max_tokens=10)
    engine = BatchEngine(
        toy_target,
        ModelDrafter(Broken(toy_draft.net)),
        max_batch=2,
        policy_factory=lambda p: FixedK(2),
    )
    got = run_batch(engine, {rid: (PROMPTS[rid], params) for rid in ("a", "e")})
    for rid in ("a", "e"):
        assert tokens_of(got[rid]) == alone(toy_target, None, PROMPTS[rid], params, 0)
    assert any("out of memory" in (r.fallback or "") for r in got["a"])


def test_eos_and_stop_per_sequence(toy_target: LlamaLM) -> None:
    """A scripted drafter that always proposes EOS: sequences stop exactly where alone."""
    eos = toy_target.info.eos_token_ids[0]
    greedy = alone(toy_target, None, PROMPTS["c"], SamplingParams(max_tokens=8), 0)

    class StopAfter:
        def check(self, output: list[int]) -> int | None:
            return 3 if len(output) >= 3 else None

    def script(context: object, k: int) -> list[int]:
        return [eos] * k

    engine = BatchEngine(
        toy_target,
        PerRow(lambda: ScriptedDrafter(script, vocab_size=64)),
        max_batch=2,
        policy_factory=lambda p: FixedK(4),
    )
    engine.add("stop", PROMPTS["c"], SamplingParams(max_tokens=8), stop=StopAfter())
    engine.add("len", PROMPTS["c"], SamplingParams(max_tokens=8))
    out: dict[str, list[StepRecord]] = {"stop": [], "len": []}
    while engine.active:
        for u in engine.step():
            out[u.request_id].append(u.record)
    assert tokens_of(out["stop"]) == greedy[:3] and out["stop"][-1].finish_reason == "stop"
    assert tokens_of(out["len"]) == greedy and out["len"][-1].finish_reason in ("length", "eos")


def test_bad_requests_raise_typed_errors(toy_target: LlamaLM) -> None:
    engine = BatchEngine(toy_target, max_batch=2, capacity=32)
    params = SamplingParams(max_tokens=4)
    with pytest.raises(PromptError):
        engine.add("x", [], params)
    with pytest.raises(PromptError):
        engine.add("x", [1, 64], params)
    with pytest.raises(PromptError):
        engine.add("x", list(range(1, 40)), params)
    engine.add("x", [1, 2, 3], params)
    with pytest.raises(InvalidParameterError):
        engine.add("x", [1, 2, 3], params)
    with pytest.raises(InvalidParameterError):
        BatchEngine(toy_target, max_batch=0)
    assert engine.step()[0].record.emitted
    assert BatchEngine(toy_target).step() == []


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_tree_drafts_in_a_batch_equal_alone(
    endless: LlamaLM, endless_draft: LlamaLM, temperature: float
) -> None:
    """Rows with trees (per-row positions and masks) next to padding, compacted per row."""
    from spectune.drafters import TreeDrafter, TreeShape

    shape = TreeShape(width=2, nodes=10)
    params = SamplingParams(temperature=temperature, max_tokens=20)
    seeds = {rid: 31 + i for i, rid in enumerate(PROMPTS)}
    engine = BatchEngine(
        endless,
        PerRow(lambda: TreeDrafter(endless_draft, shape)),
        max_batch=3,
        policy_factory=lambda p: FixedK(3),
    )
    got = run_batch(engine, {rid: (p, params) for rid, p in PROMPTS.items()}, seeds=seeds)
    for rid, prompt in PROMPTS.items():
        engine_alone = SpeculativeEngine(endless, TreeDrafter(endless_draft, shape))
        gen = torch.Generator().manual_seed(seeds[rid])
        expected = engine_alone.run(prompt, params, policy=FixedK(3), generator=gen).steps
        assert tokens_of(got[rid]) == tokens_of(expected), rid
        assert all(r.fallback is None for r in got[rid])
        # Every count of every step as alone: a tree step records its depth, so its
        # positions (the acceptance denominator) are the depth, not the node count.
        assert [counts(r) for r in got[rid]] == [counts(r) for r in expected], rid
        assert any(r.tree_depth is not None and r.tree_depth < r.num_draft_tokens for r in got[rid])


@pytest.mark.slow
def test_batch_greedy_equals_alone_on_the_real_model(smollm2) -> None:  # type: ignore[no-untyped-def]
    target = smollm2.model
    draft = perturbed(target, 0.05)  # agrees often, not always (no trained draft needed)
    questions = ("Name a color.", "What is 2 + 2? Explain briefly.", "Say hi.")
    prompts = {
        f"q{i}": smollm2.tokenizer.encode_chat([{"role": "user", "content": q}])
        for i, q in enumerate(questions)
    }
    params = SamplingParams(max_tokens=16)
    engine = BatchEngine(
        target, ModelDrafter(draft), max_batch=3, policy_factory=lambda p: FixedK(3)
    )
    got = run_batch(engine, {rid: (p, params) for rid, p in prompts.items()})
    for rid, prompt in prompts.items():
        assert tokens_of(got[rid]) == alone(target, None, prompt, params, 0), rid


def fresh_feature(drafter: FeatureDrafter) -> FeatureDrafter:
    return FeatureDrafter(drafter.head, drafter.vocab_subset, name=drafter.name)


@pytest.mark.parametrize(("k", "temperature"), [(1, 0.0), (4, 0.0), (3, 0.8)])
def test_feature_head_batch_equals_alone(
    endless: LlamaLM, toy_feature_drafter: FeatureDrafter, k: int, temperature: float
) -> None:
    """The feature head drafts the whole batch in one head forward per draft step and each
    sequence still decodes as it would alone (rows join, leave and move: max_batch 3 < 5)."""
    params = SamplingParams(temperature=temperature, max_tokens=24)
    seeds = {rid: 40 + i for i, rid in enumerate(PROMPTS)}
    engine = BatchEngine(
        endless, toy_feature_drafter, max_batch=3, capacity=256, policy_factory=lambda p: FixedK(k)
    )
    assert isinstance(engine.drafter, FeatureRows)
    got = run_batch(engine, {rid: (p, params) for rid, p in PROMPTS.items()}, seeds=seeds)
    accepted = drafted = 0
    for rid, prompt in PROMPTS.items():
        expected = alone(endless, fresh_feature(toy_feature_drafter), prompt, params, k, seeds[rid])
        assert tokens_of(got[rid]) == expected, rid
        alone_steps = SpeculativeEngine(endless, fresh_feature(toy_feature_drafter)).run(
            prompt, params, policy=FixedK(k), generator=torch.Generator().manual_seed(seeds[rid])
        )
        assert [(r.num_draft_tokens, r.accepted) for r in got[rid]] == [
            (s.num_draft_tokens, s.accepted) for s in alone_steps.steps
        ], rid  # the same drafts were proposed, not only the same output
        accepted += sum(r.accepted for r in got[rid])
        drafted += sum(r.num_draft_tokens for r in got[rid])
    assert 0 < accepted < drafted
    assert engine.active == 0


@pytest.mark.parametrize("kind", ["batch", "sequential"])
def test_both_step_engines_share_one_add_contract(toy_target: LlamaLM, kind: str) -> None:
    """The scheduler drives either engine: the same keywords, the same typed errors, the
    same update type."""
    params = SamplingParams(max_tokens=3)
    engine: BatchEngine | SequentialBatchEngine = (
        BatchEngine(toy_target, max_batch=1, capacity=32)
        if kind == "batch"
        else SequentialBatchEngine(toy_target, max_batch=1)
    )
    engine.add("x", [1, 2, 3], params, generator=None, stop=None, policy=FixedK(0))
    with pytest.raises(InvalidParameterError):
        engine.add("x", [1, 2, 3], params)
    with pytest.raises(BatchFullError):
        engine.add("y", [1, 2, 3], params)
    (update,) = engine.step()
    assert type(update) is SequenceUpdate and update.request_id == "x"
    engine.cancel("x")
    with pytest.raises(PromptError):
        engine.add("z", [], params)


def guessing(target: LlamaLM, drafter: PerRow | ModelDrafter) -> BatchEngine:
    """A batched engine of three rows whose steps are all plain and ask for guesses."""
    return BatchEngine(
        target, drafter, max_batch=3, capacity=256, policy_factory=lambda p: ShadowOnly()
    )


def test_batched_plain_steps_check_a_model_free_drafters_guess(endless: LlamaLM) -> None:
    """The batched engine asks a model-free row set for the guesses of its plain steps
    that want them (StepPlan.shadow), in the draft pass: the same evidence as one
    sequence alone, and the same output."""
    params = SamplingParams(max_tokens=24)
    engine = guessing(endless, PerRow(NgramDrafter))
    got = run_batch(engine, {rid: (p, params) for rid, p in PROMPTS.items()})
    for rid, prompt in PROMPTS.items():
        single = list(
            SpeculativeEngine(endless, NgramDrafter()).generate(prompt, params, policy=ShadowOnly())
        )
        assert tokens_of(got[rid]) == tokens_of(single)
        assert [r.shadow_hit for r in got[rid]] == [r.shadow_hit for r in single]
    assert any(r.shadow_hit is not None for records in got.values() for r in records)


def test_batched_plain_steps_check_a_models_guess_at_temperature_0_only(
    endless: LlamaLM, endless_draft: LlamaLM
) -> None:
    """A draft model's guesses are asked for in the draft pass of the rows at T = 0 only
    (drafters.base.guesses): the same evidence as one sequence alone, and the same output;
    a sampled row beside them gets none."""
    greedy, hot = SamplingParams(max_tokens=16), SamplingParams(temperature=0.8, max_tokens=16)
    engine = guessing(endless, ModelDrafter(endless_draft))
    wanted = {"a": (PROMPTS["a"], greedy), "b": (PROMPTS["b"], greedy), "c": (PROMPTS["c"], hot)}
    got = run_batch(engine, wanted)
    for rid in ("a", "b"):
        single = list(
            SpeculativeEngine(endless, ModelDrafter(endless_draft)).generate(
                PROMPTS[rid], greedy, policy=ShadowOnly()
            )
        )
        assert tokens_of(got[rid]) == tokens_of(single)
        assert [r.shadow_hit for r in got[rid]] == [r.shadow_hit for r in single]
        assert all(r.shadow_hit is not None for r in got[rid][:-1])
    assert all(r.shadow_hit is None for r in got["c"])
