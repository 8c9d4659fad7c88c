"""A learned drafter is written once, for rows: its one-sequence face is a one-row set
(``spectune.drafters.base.OneRow``), and a row of a batched row set drafts what the
drafter drafts alone."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from spectune.decode.step import CHUNK_SLACK
from spectune.draft import CONTEXT_FULL, Draft, Refusal, RefusalKind
from spectune.drafters.base import DraftRequest, OneRow
from spectune.drafters.model import ModelDrafter
from spectune.drafters.scripted import ScriptedRows
from spectune.errors import DrafterError
from spectune.models.llama import LlamaLM
from spectune.sampling import SamplingParams

CONTEXTS = [[1, 5, 9, 13, 7], [2, 3], [4, 8, 15, 16, 23, 42, 11, 9]]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_row_of_a_batched_session_drafts_what_the_drafter_drafts_alone(
    toy_draft: LlamaLM, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature)
    state = ModelDrafter(toy_draft).open(len(CONTEXTS), 64 + CHUNK_SLACK, CHUNK_SLACK)
    for row, context in enumerate(CONTEXTS):
        state.add(row, context, None)
    requests = [
        DraftRequest(row, context, 2 + row, params, torch.Generator().manual_seed(row))
        for row, context in enumerate(CONTEXTS)
    ]
    batched = state.propose(requests, len(CONTEXTS))
    for row, context in enumerate(CONTEXTS):
        alone = ModelDrafter(toy_draft)
        alone.reset()
        alone.commit(context, None)
        draft = alone.propose(context, 2 + row, params, torch.Generator().manual_seed(row))
        got = batched[row]
        assert isinstance(got, Draft)
        assert got.tokens.tolist() == draft.tokens.tolist(), row
        assert got.probs is not None and draft.probs is not None
        torch.testing.assert_close(got.probs, draft.probs, atol=1e-5, rtol=1e-4)


def test_one_row_refusals_are_drafter_errors_and_k_zero_is_empty(toy_draft: LlamaLM) -> None:
    drafter = ModelDrafter(toy_draft)
    empty = drafter.propose([1, 2, 3], 0, SamplingParams(), None)
    assert empty.tokens.shape == (0,)
    assert empty.probs is not None and empty.probs.shape == (0, toy_draft.info.vocab_size)
    # A one-row set of 8 slots: a context of 8 and 2 draft tokens do not fit.
    row = OneRow(lambda: drafter.open(1, capacity=8))
    with pytest.raises(DrafterError, match="draft_context_full"):
        row.propose(list(range(1, 9)), 2, SamplingParams(), None)
    # Proposing before any commit joins the row with the context (what a fresh drafter does).
    fresh = ModelDrafter(toy_draft)
    draft = fresh.propose([1, 5, 9], 2, SamplingParams(), None)
    assert len(draft) == 2 and fresh.row.joined
    fresh.reset()
    assert not fresh.row.joined and fresh.row.state.cache.length() == 0


def test_each_refusal_kind_reads_as_its_fallback_reason() -> None:
    """The reason text records, traces and the monitor read is derived from the typed
    refusal in one place: ``<kind>`` or ``<kind>: <detail>``, first line, 200 characters."""
    assert CONTEXT_FULL.reason == "draft_context_full" and not CONTEXT_FULL.permanent
    failed = Refusal.error(ValueError("probabilities hold NaN\nsecond line"))
    assert failed.kind is RefusalKind.DRAFTER_ERROR and failed.permanent
    assert failed.reason == "drafter_error: probabilities hold NaN"
    assert Refusal.error("x" * 300).reason == "drafter_error: " + "x" * 185
    assert Refusal.error(RuntimeError()).reason == "drafter_error: "  # an empty message
    late = Refusal(RefusalKind.DRAFT_DEADLINE, "the drafter is still in a late pass")
    assert late.reason == "draft_deadline: the drafter is still in a late pass"
    assert {kind.value for kind in RefusalKind} == {
        "draft_context_full",
        "drafter_error",
        "draft_deadline",
    }


def refuse(refusal: Refusal, request: DraftRequest) -> Refusal:
    return refusal


def test_a_one_row_refusal_raises_its_detail() -> None:
    """The single engine adds the ``drafter_error: `` kind itself: the exception carries
    the detail only (the kind's name where there is none)."""
    for refusal, message in (
        (Refusal.error("boom"), "^boom$"),
        (CONTEXT_FULL, "^draft_context_full$"),
    ):
        row = OneRow(partial(ScriptedRows, partial(refuse, refusal)))
        with pytest.raises(DrafterError, match=message):
            row.propose([1, 2], 2, SamplingParams(), None)
