"""The per-request state both engines share (``spectune.decode.sequence``): its three verbs
on hand-made steps, without a model."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from spectune.control.base import FixedK, StepPlan
from spectune.decode.sequence import SequenceState, Step
from spectune.decode.step import CHUNK_SLACK
from spectune.draft import CONTEXT_FULL, Draft, Refusal
from spectune.errors import PromptError
from spectune.models.base import ModelInfo
from spectune.records import StepRecord
from spectune.sampling import SamplingParams
from spectune.verify.chain import VerifyResult, chain_result

EOS = 2
INFO = ModelInfo(
    name="fake",
    family="llama",
    vocab_size=10,
    max_context=64,
    bos_token_id=None,
    eos_token_ids=(EOS,),
    pad_token_id=None,
    num_parameters=0,
    hidden_size=4,
)


class Policy(FixedK):
    """FixedK that says why it holds K at 0, remembers what it observed and may ask for
    chunked verification."""

    def __init__(self, k: int, groups: int | None = None) -> None:
        super().__init__(k)
        self.groups = groups
        self.seen: list[StepRecord] = []

    def plan(self) -> StepPlan:
        groups = None if self.groups is None else (self.groups,) * (self.k + 1)
        return StepPlan(self.k, groups, "held: k is 0" if self.k == 0 else None)

    def observe(self, record: StepRecord) -> None:
        self.seen.append(record)


@dataclass
class Cache:
    """Records what ``keep_path`` asks of the cache."""

    truncated: list[tuple[int, int]] = field(default_factory=list)
    moved: list[tuple[int, list[int], int]] = field(default_factory=list)

    def truncate(self, length: int, row: int = 0) -> None:
        self.truncated.append((length, row))

    def move_slots(self, row: int, src: Tensor, dst_start: int) -> None:
        self.moved.append((row, src.tolist(), dst_start))


def sequence(
    prompt: list[int] | None = None,
    *,
    k: int = 4,
    max_tokens: int = 20,
    context_limit: int = 64,
    groups: int | None = None,
    verify_groups: int | None = 1,
    row: int = 0,
) -> SequenceState:
    return SequenceState.start(
        "r",
        prompt or [1, 3, 4],
        SamplingParams(max_tokens=max_tokens),
        INFO,
        context_limit,
        policy=Policy(k, groups),
        generator=torch.Generator().manual_seed(0),
        stop=None,
        verify_groups=verify_groups,
        row=row,
    )


def chain(tokens: list[int]) -> Draft:
    return Draft(torch.tensor(tokens, dtype=torch.long), None)


def test_start_checks_the_prompt_and_sizes_the_sequence() -> None:
    seq = sequence([1, 3, 4], max_tokens=20)
    assert seq.capacity == min(64, 3 + 20 + CHUNK_SLACK) and seq.context == [1, 3, 4]
    with pytest.raises(PromptError):
        sequence([1, 99])  # outside the vocabulary
    with pytest.raises(PromptError):
        sequence([1] * 10, context_limit=10)


def test_plan_clamps_k_to_max_tokens_and_the_room() -> None:
    assert sequence(k=4).plan(drafting=True, start=0.0).k == 4
    assert sequence(k=4).plan(drafting=False, start=0.0).k == 0
    # Two tokens left to emit: at most one drafted (a step emits k + 1).
    assert sequence(k=4, max_tokens=2).plan(drafting=True, start=0.0).k == 1
    # The context of 8 holds the 5-token prompt: 3 slots, so 2 draft tokens.
    tight = sequence([1, 3, 4, 5, 6], k=4, max_tokens=20, context_limit=8)
    assert tight.plan(drafting=True, start=0.0).k == 2
    held = sequence(k=0).plan(drafting=True, start=0.0)
    assert (held.k, held.fallback) == (0, "held: k is 0")


def test_accept_fits_a_draft_and_takes_the_policys_groups() -> None:
    seq = sequence(k=4, groups=2)
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, chain([5, 6, 7]))
    assert step.draft.tokens.tolist() == [5, 6, 7] and step.verify_groups == 2
    # No preference from the policy: the engine's default; None: one pass always.
    for default, expected in ((3, 3), (None, 1)):
        seq = sequence(k=4, verify_groups=default)
        step = seq.plan(drafting=True, start=0.0)
        seq.accept(step, chain([5, 6, 7]))
        assert step.verify_groups == expected
    # A tree is verified in one pass.
    seq = sequence(k=4, groups=3)
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, Draft(torch.tensor([5, 6, 7]), None, torch.tensor([-1, -1, 0])))
    assert step.verify_groups == 1 and step.draft.parents is not None


def test_accept_turns_refusals_and_bad_drafts_into_fallbacks() -> None:
    seq = sequence()
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, CONTEXT_FULL)  # passing: this step only
    assert step.fallback == "draft_context_full" and seq.drafter_failure is None
    assert len(step.draft) == 0 and seq.plan(drafting=True, start=0.0).k == 4

    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, chain([5, 6, 7, 8, 9]))  # five tokens for k = 4
    assert step.fallback is not None and step.fallback.startswith("drafter_error: ")
    assert seq.drafter_failure == step.fallback and len(step.draft) == 0
    later = seq.plan(drafting=True, start=0.0)  # plain to the end, with the reason
    assert (later.k, later.fallback) == (0, seq.drafter_failure)

    seq = sequence()
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, Refusal.error("boom"))  # permanent
    assert seq.drafter_failure == "drafter_error: boom"


def settle(
    seq: SequenceState, step: Step, result: VerifyResult, cache: Cache, length: int
) -> tuple[StepRecord, list[list[int]]]:
    commits: list[list[int]] = []
    record = seq.settle(step, result, cache, length, commits.append)  # type: ignore[arg-type]
    return record, commits


def test_settle_keeps_the_path_commits_and_records() -> None:
    seq = sequence(k=3, row=2)
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, chain([5, 6, 7]))
    step.draft_time, step.target_time, step.verify_peak_bytes = 0.1, 0.2, 123
    cache = Cache()
    record, commits = settle(seq, step, chain_result(2, (5, 6, 8), False), cache, 2)
    assert cache.truncated == [(2 + 1 + 2, 2)] and cache.moved == []  # a chain stays in place
    assert seq.context == [1, 3, 4, 5, 6, 8] and seq.output == [5, 6, 8]
    assert commits == [[0, 1, 2]]  # the pending token's row, then the accepted rows
    assert (record.index, record.k, record.num_draft_tokens, record.accepted) == (0, 3, 3, 2)
    assert record.emitted == (5, 6, 8) and record.finish_reason is None
    assert (record.draft_time, record.target_time, record.verify_peak_bytes) == (0.1, 0.2, 123)
    assert record.tree_depth is None and record.verify_groups == 1
    assert seq.policy.seen == [record] and seq.index == 1  # type: ignore[attr-defined]


def test_settle_compacts_a_tree_path() -> None:
    seq = sequence(k=2)
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, Draft(torch.tensor([5, 6, 7]), None, torch.tensor([-1, -1, 1])))
    cache = Cache()
    result = VerifyResult(2, (6, 7, 9), True, (2, 3))
    record, commits = settle(seq, step, result, cache, 2)
    assert cache.moved == [(0, [4, 5], 3)] and cache.truncated == [(5, 0)]
    assert commits == [[0, 2, 3]] and record.tree_depth == 2 and record.positions == 2


def test_settle_stops_and_then_tells_the_drafter_nothing() -> None:
    seq = sequence(k=3)
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, chain([5, EOS, 7]))
    record, commits = settle(seq, step, chain_result(2, (5, EOS, 9), False), Cache(), 2)
    assert record.emitted == (5, EOS) and record.finish_reason == "eos" and commits == []

    seq = sequence(k=3, max_tokens=2)
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, chain([5]))
    record, _ = settle(seq, step, chain_result(1, (5, 6), True), Cache(), 2)
    assert record.finish_reason == "length" and seq.output == [5, 6]

    # The context is full before max_tokens: "length" too.
    seq = sequence([1, 3, 4, 5, 6], k=4, context_limit=8)
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, chain([5, 6]))
    record, commits = settle(seq, step, chain_result(2, (5, 6, 7), True), Cache(), 4)
    assert record.finish_reason == "length" and commits == []


def test_a_failed_drafter_hears_no_more_commits() -> None:
    seq = sequence()
    step = seq.plan(drafting=True, start=0.0)
    seq.accept(step, Refusal.error("boom"))
    _, commits = settle(seq, step, chain_result(0, (5,), True), Cache(), 2)
    assert commits == []
