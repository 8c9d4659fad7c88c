"""End-to-end engine behaviour on toy models: greedy exactness, stops, fallbacks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from spectune.control.base import FixedK, StepPlan
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import FailingDrafter, ModelDrafter, NgramDrafter, ScriptedDrafter
from spectune.errors import InvalidParameterError, PromptError
from spectune.models.llama import LlamaLM
from spectune.models.toy import toy_model
from spectune.records import StepRecord
from spectune.sampling import SamplingParams

PROMPTS = ([1, 5, 6, 7], [1, 9, 9, 12, 30, 9, 9, 12], [3])
GREEDY = SamplingParams(max_tokens=48)


def plain(model: LlamaLM, prompt: Sequence[int], params: SamplingParams = GREEDY) -> list[int]:
    return SpeculativeEngine(model).run(prompt, params).tokens


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_greedy_equals_target_alone(
    toy_target: LlamaLM, toy_draft: LlamaLM, k: int, drafter_kind: str
) -> None:
    drafter = ModelDrafter(toy_draft) if drafter_kind == "model" else NgramDrafter()
    engine = SpeculativeEngine(toy_target, drafter)
    drafted = 0
    for prompt in PROMPTS:
        result = engine.run(prompt, GREEDY, policy=FixedK(k))
        assert result.tokens == plain(toy_target, prompt)
        drafted += result.drafted
    assert drafted > 0  # speculation really ran (a one-token prompt gives n-gram nothing)


def test_identical_draft_always_accepted(toy_target: LlamaLM) -> None:
    engine = SpeculativeEngine(toy_target, ModelDrafter(toy_target))
    for params in (GREEDY, SamplingParams(temperature=0.8, max_tokens=48, seed=3)):
        result = engine.run(PROMPTS[0], params, policy=FixedK(4))
        assert result.acceptance_rate == 1.0


def test_sampling_is_reproducible_with_a_seed(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    engine = SpeculativeEngine(toy_target, ModelDrafter(toy_draft))
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=11)
    first = engine.run(PROMPTS[0], params, policy=FixedK(3)).tokens
    assert engine.run(PROMPTS[0], params, policy=FixedK(3)).tokens == first


def test_max_tokens_inside_a_draft(toy_target: LlamaLM) -> None:
    engine = SpeculativeEngine(toy_target, ModelDrafter(toy_target))
    params = SamplingParams(max_tokens=5)
    result = engine.run(PROMPTS[0], params, policy=FixedK(8))
    assert result.tokens == plain(toy_target, PROMPTS[0])[:5]
    assert result.finish_reason == "length"
    assert all(step.k <= 4 for step in result.steps)  # never drafts past the budget


def test_eos_inside_a_draft(toy_target: LlamaLM) -> None:
    reference = plain(toy_target, PROMPTS[0])
    eos = reference[3]
    cut = reference.index(eos)
    net = toy_target.net
    with_eos = dataclasses.replace(net.cfg, eos_token_ids=(eos,))
    model = LlamaLM(net)
    object.__setattr__(
        model, "_info", dataclasses.replace(model.info, eos_token_ids=with_eos.eos_token_ids)
    )
    # The drafter proposes the target's own continuation, so EOS arrives mid-draft.
    drafter = ScriptedDrafter(
        lambda ctx, k: reference[len(ctx) - len(PROMPTS[0]) :][:k], vocab_size=net.cfg.vocab_size
    )
    result = SpeculativeEngine(model, drafter).run(PROMPTS[0], GREEDY, policy=FixedK(8))
    assert result.tokens == reference[: cut + 1]
    assert result.finish_reason == "eos"


@pytest.mark.parametrize("mode", ["raise", "nan", "oov"])
def test_failing_drafter_falls_back_to_plain(toy_target: LlamaLM, mode: str) -> None:
    drafter = FailingDrafter(mode, vocab_size=toy_target.info.vocab_size, after=2)
    result = SpeculativeEngine(toy_target, drafter).run(PROMPTS[0], GREEDY, policy=FixedK(3))
    assert result.tokens == plain(toy_target, PROMPTS[0])
    reasons = [s.fallback for s in result.steps if s.fallback]
    assert reasons and reasons[0].startswith("drafter_error")


def test_emitted_equals_accepted_plus_steps(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    result = SpeculativeEngine(toy_target, ModelDrafter(toy_draft)).run(
        PROMPTS[1], SamplingParams(max_tokens=400), policy=FixedK(4)
    )
    # Every step emits its accepted tokens plus one (until a stop truncates the last step).
    assert sum(len(s.emitted) for s in result.steps[:-1]) == sum(
        s.accepted + 1 for s in result.steps[:-1]
    )


def test_bad_inputs_raise_typed_errors(toy_target: LlamaLM) -> None:
    engine = SpeculativeEngine(toy_target)
    with pytest.raises(PromptError, match="empty"):
        engine.run([], GREEDY)
    with pytest.raises(PromptError, match="context"):
        engine.run([1] * toy_target.info.max_context, GREEDY)
    with pytest.raises(PromptError, match="vocabulary"):
        engine.run([1, 10_000], GREEDY)
    for bad in (
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_tokens": 0},
    ):
        with pytest.raises(InvalidParameterError):
            SamplingParams(**bad)  # type: ignore[arg-type]
    for k in (0, -1, 1000):
        with pytest.raises(InvalidParameterError):
            FixedK(k if k else -1)


def test_generation_reaching_the_context_end_stops_cleanly() -> None:
    from spectune.models.toy import toy_config

    model = toy_model(0, config=toy_config(max_context=24), scale=3.0)
    result = SpeculativeEngine(model, NgramDrafter()).run(
        [1, 5, 6, 7], SamplingParams(max_tokens=100), policy=FixedK(4)
    )
    assert result.finish_reason == "length"
    assert len(result.tokens) == 24 - 4


def test_drafter_receives_target_features(toy_target: LlamaLM) -> None:
    seen: list[tuple[int, int, int]] = []

    class Recorder(ScriptedDrafter):
        def commit(self, context, features):  # type: ignore[no-untyped-def]
            assert features is not None
            seen.append((len(context), features.start, features.hidden.shape[0]))

    drafter = Recorder(lambda ctx, k: [5] * k, vocab_size=toy_target.info.vocab_size)
    SpeculativeEngine(toy_target, drafter).run(PROMPTS[0], SamplingParams(max_tokens=12))
    # Prefill: hidden states of every prompt token but the pending one.
    assert seen[0] == (4, 0, 3)
    # Later steps: states start at the previous pending token; the new pending has none yet.
    for (length, start, n), (_, prev_start, prev_n) in zip(seen[1:], seen, strict=False):
        assert start == prev_start + prev_n
        assert start + n == length - 1


class ShadowOnly:
    """Plain steps that ask for the drafter's guess to be checked (StepPlan.shadow)."""

    def plan(self) -> StepPlan:
        return StepPlan(0, shadow=True)

    def observe(self, record: StepRecord) -> None:
        """Nothing to learn."""


def test_plain_steps_check_a_model_free_drafters_guess(
    toy_target: LlamaLM, toy_draft: LlamaLM
) -> None:
    """A shadow guess is compared with the token the step emitted and changes nothing
    else; a drafter that runs a model is asked at temperature 0 only (next test)."""
    prompt = PROMPTS[1]
    drafter = NgramDrafter()
    records = list(
        SpeculativeEngine(toy_target, drafter).generate(prompt, GREEDY, policy=ShadowOnly())
    )
    tokens = [t for record in records for t in record.emitted]
    assert tokens == plain(toy_target, prompt)
    context = list(prompt)
    checked = 0
    for record in records:
        assert record.num_draft_tokens == 0
        guess = NgramDrafter().propose(context, 1, GREEDY, None)
        if len(guess):
            checked += 1
            assert record.shadow_hit == (int(guess.tokens[0]) == record.emitted[0])
        else:
            assert record.shadow_hit is None
        context.extend(record.emitted)
    assert checked > 0 and any(record.shadow_hit for record in records)


def test_plain_steps_check_a_models_guess_at_temperature_0_only(
    toy_target: LlamaLM, toy_draft: LlamaLM
) -> None:
    """At T = 0 a draft model's one-token guess is one-hot: it is checked like a lookup's
    (its greedy token against the emitted one) and the output stays the target's. At
    T > 0 its drafts are sampled from probabilities, not guesses: it is not asked (no
    draft time spent, no evidence)."""
    prompt = PROMPTS[1]
    engine = SpeculativeEngine(toy_target, ModelDrafter(toy_draft))
    records = list(engine.generate(prompt, GREEDY, policy=ShadowOnly()))
    assert [t for record in records for t in record.emitted] == plain(toy_target, prompt)
    context = list(prompt)
    for record in records[:-1]:  # the last step may end the request
        guess = ModelDrafter(toy_draft).propose(context, 1, GREEDY, None)
        assert record.shadow_hit == (int(guess.tokens[0]) == record.emitted[0])
        assert record.draft_time > 0.0
        context.extend(record.emitted)
    assert {record.shadow_hit for record in records[:-1]} == {True, False}
    sampled = SamplingParams(temperature=0.8, max_tokens=24, seed=5)
    hot = list(engine.generate(prompt, sampled, policy=ShadowOnly()))
    assert all(r.shadow_hit is None and r.draft_time == 0.0 for r in hot)
    assert [t for r in hot for t in r.emitted] == plain(toy_target, prompt, sampled)
