"""Chunked verification emits exactly what one-pass verification emits."""

from __future__ import annotations

import pytest
import torch

from spectune.control.base import FixedK, StepPlan
from spectune.control.chunking import best_groups, chunked_pays, expected_chunked_cost, group_bounds
from spectune.control.costs import CostCurve
from spectune.control.registry import make_policy
from spectune.decode.engine import SpeculativeEngine
from spectune.decode.sequential import SequentialBatchEngine
from spectune.drafters import ModelDrafter
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.records import StepRecord
from spectune.sampling import SamplingParams, process_logits
from spectune.verify.chain import verify_greedy, verify_sampled
from spectune.verify.grouped import verify_in_groups


@pytest.mark.parametrize(
    "k, groups, bounds",
    [(8, 2, [4, 8]), (8, 3, [2, 5, 8]), (4, 4, [1, 2, 3, 4]), (3, 5, [1, 2, 3]), (5, 1, [5])],
)
def test_group_bounds(k: int, groups: int, bounds: list[int]) -> None:
    assert group_bounds(k, groups) == bounds


def test_group_bounds_rejects_zero_groups() -> None:
    with pytest.raises(InvalidParameterError):
        group_bounds(4, 0)


def sliced(target_logits: torch.Tensor, calls: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    def score(start: int, end: int) -> torch.Tensor:
        assert not calls or calls[-1][1] == start  # consecutive ranges only
        calls.append((start, end))
        return target_logits[start:end]

    return score


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("with_probs", [True, False])
def test_same_tokens_as_one_pass_for_the_same_random_numbers(
    temperature: float, with_probs: bool
) -> None:
    params = SamplingParams(temperature=temperature, top_p=0.9 if temperature else 1.0)
    setup = torch.Generator().manual_seed(3)
    vocab = 6
    for trial in range(400):
        k = 1 + trial % 8
        draft_probs = (torch.randn(k, vocab, generator=setup) * 1.5).softmax(-1)
        tokens = torch.multinomial(draft_probs, 1, generator=setup).view(-1)
        target_logits = torch.randn(k + 1, vocab, generator=setup) * 1.5
        probs = draft_probs if with_probs else None
        if params.greedy:
            expected = verify_greedy(tokens, target_logits)
        else:
            expected = verify_sampled(
                tokens,
                probs,
                process_logits(target_logits, params),
                torch.Generator().manual_seed(trial),
            )
        for groups in range(2, k + 1):
            calls: list[tuple[int, int]] = []
            got = verify_in_groups(
                tokens,
                probs,
                sliced(target_logits, calls),
                groups,
                params,
                torch.Generator().manual_seed(trial),
            )
            assert got == expected, (trial, groups)
            # Scoring stopped at the group holding the first rejection.
            bounds = group_bounds(k, groups)
            needed = next((j for j, end in enumerate(bounds) if expected.num_accepted < end), None)
            assert len(calls) == (len(bounds) if needed is None else needed + 1)


class CountingLM(LlamaLM):
    def __init__(self, model: LlamaLM) -> None:
        super().__init__(model.net, name=model.info.name)
        self.tokens_forwarded = 0

    def forward(self, tokens, cache, **kwargs):  # type: ignore[no-untyped-def]
        self.tokens_forwarded += tokens.shape[1]
        return super().forward(tokens, cache, **kwargs)


class GroupedK(FixedK):
    def __init__(self, k: int, groups: int) -> None:
        super().__init__(k)
        self.groups = groups

    def plan(self) -> StepPlan:
        return StepPlan(self.k, (self.groups,) * (self.k + 1))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_with_chunked_verification_matches_one_pass(
    toy_target: LlamaLM, toy_draft: LlamaLM, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, max_tokens=40)
    prompt = [1, 5, 9, 13, 7]
    one_pass = SpeculativeEngine(toy_target, ModelDrafter(toy_draft)).run(
        prompt, params, policy=FixedK(8), generator=torch.Generator().manual_seed(9)
    )
    counting = CountingLM(toy_target)
    chunked = SpeculativeEngine(counting, ModelDrafter(toy_draft)).run(
        prompt, params, policy=GroupedK(8, 4), generator=torch.Generator().manual_seed(9)
    )
    assert chunked.tokens == one_pass.tokens

    def shape(steps: list[StepRecord]) -> list[tuple[int, int]]:
        return [(s.num_draft_tokens, s.accepted) for s in steps]

    assert shape(chunked.steps) == shape(one_pass.steps)
    full_cost = len(prompt) - 1 + sum(s.num_draft_tokens + 1 for s in one_pass.steps)
    assert counting.tokens_forwarded < full_cost  # early rejections skipped later groups


def test_engine_option_and_bad_value(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    params = SamplingParams(max_tokens=20)
    plain = SpeculativeEngine(toy_target).run([1, 22, 23], params, policy=FixedK(0)).tokens
    engine = SpeculativeEngine(toy_target, ModelDrafter(toy_draft), verify_groups=2)
    assert engine.run([1, 22, 23], params, policy=FixedK(6)).tokens == plain
    with pytest.raises(InvalidParameterError):
        SpeculativeEngine(toy_target, verify_groups=0)


FLAT = CostCurve((1, 2, 4, 8, 16), (1.0, 1.0, 1.0, 1.0, 1.0))  # memory bound: size is free
LINEAR = CostCurve((1, 2, 4, 8, 16), (1.0, 2.0, 4.0, 8.0, 16.0))  # compute bound


def test_cost_model() -> None:
    # One group is the one-pass cost.
    assert expected_chunked_cost(LINEAR, 0.5, 8, 1) == pytest.approx(LINEAR.relative(8))
    # Two groups of 4 on a linear curve: 4 + 0.5^4 * 5 token-forwards.
    assert expected_chunked_cost(LINEAR, 0.5, 8, 2) == pytest.approx(4 + 0.5**4 * 5)
    # Every extra pass costs a full forward when size is free: never pays.
    assert not chunked_pays(FLAT, 0.2, 8, 2)
    assert best_groups(FLAT, 0.2, 8) == 1
    # Compute bound and a weak draft: splitting pays; a perfect draft: it does not.
    assert chunked_pays(LINEAR, 0.3, 8, 2)
    assert not chunked_pays(LINEAR, 1.0, 8, 2)
    assert best_groups(LINEAR, 0.3, 8) > 1
    assert not chunked_pays(LINEAR, 0.3, 1, 2)


def record(k: int, accepted: int, *, groups: int = 1) -> StepRecord:
    return StepRecord(
        index=0,
        k=k,
        num_draft_tokens=k,
        accepted=accepted,
        emitted=(1,) * (accepted + 1),
        draft_time=0.001 * k,
        target_time=0.1,
        step_time=0.1 + 0.001 * k,
        verify_groups=groups,
    )


@pytest.mark.parametrize(("curve", "chunks"), [(LINEAR, True), (FLAT, False)])
def test_cost_policy_chooses_chunked_verification_where_it_pays(
    curve: CostCurve, chunks: bool
) -> None:
    """A weak draft (1 of 4 accepted) on a compute-bound curve: groups; on a flat one: never.
    Through ``make_policy``, so the plan comes through the fallback wrapper."""
    policy = make_policy("cost", {"initial_k": 4}, cost_curve=curve)
    assert policy.plan().verify_groups is None  # no opinion before the warm-up
    for _ in range(6):
        policy.observe(record(4, 1))
    inner = policy.inner  # type: ignore[attr-defined]
    # On the linear curve no K beats plain decoding at this acceptance, so hold K at 4 by
    # hand to read the groups the policy would verify each draft length in.
    inner.k = 4
    plan = policy.plan()
    assert plan.k == 4 and plan.verify_groups is not None
    assert plan.verify_groups[:2] == (1, 1)  # 0 or 1 draft tokens: one pass
    for n, groups in enumerate(plan.verify_groups[2:], start=2):
        cheaper = expected_chunked_cost(curve, inner.alpha, n, groups) < curve.relative(n)
        assert (groups > 1) == cheaper == chunks


def test_engine_takes_the_groups_through_the_fallback_wrapper(
    toy_target: LlamaLM, toy_draft: LlamaLM
) -> None:
    """A policy behind fallback checks still chooses the groups; records say how many."""
    from spectune.control.fallback import Guarded, LocalFallback

    params = SamplingParams(max_tokens=40)
    prompt = [1, 5, 9, 13, 7]
    plain = SpeculativeEngine(toy_target).run(prompt, params, policy=FixedK(0)).tokens
    policy = Guarded(GroupedK(6, 3), [LocalFallback()], name="grouped")
    gen = SpeculativeEngine(toy_target, ModelDrafter(toy_draft)).run(prompt, params, policy=policy)
    assert gen.tokens == plain
    assert {s.verify_groups for s in gen.steps if s.num_draft_tokens > 1} == {3}
    assert all(s.verify_groups == 1 for s in gen.steps if s.num_draft_tokens <= 1)
    unwrapped = Guarded(FixedK(6), [], name="fixed")
    assert unwrapped.plan().verify_groups is None  # no opinion: the engine's setting applies


@pytest.mark.parametrize("limit", [None, 4])
def test_sequential_server_engine_keeps_the_policys_chunked_choice(
    toy_target: LlamaLM, toy_draft: LlamaLM, limit: int | None
) -> None:
    """The batch-size gate of the sequential engine (present with a limit) passes the
    policy's verify_groups on (it used to drop it, so the server verified in one pass
    whatever the policy chose)."""
    params = SamplingParams(max_tokens=30)
    engine = SequentialBatchEngine(
        toy_target,
        lambda: ModelDrafter(toy_draft),
        speculate_max_batch=limit,
        policy_factory=lambda p: GroupedK(6, 3),
    )
    engine.add("a", [1, 5, 9, 13, 7], params, generator=torch.Generator().manual_seed(4))
    records = [u.record for _ in range(40) for u in engine.step()]
    alone = SpeculativeEngine(toy_target, ModelDrafter(toy_draft)).run(
        [1, 5, 9, 13, 7], params, policy=GroupedK(6, 3), generator=torch.Generator().manual_seed(4)
    )
    assert [r.verify_groups for r in records] == [s.verify_groups for s in alone.steps]
    assert any(r.verify_groups == 3 for r in records)
