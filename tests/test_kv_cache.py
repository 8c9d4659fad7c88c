"""KV rollback: truncate, re-append, and compare with a fresh full recompute."""

from __future__ import annotations

from pathlib import Path

import torch

from spectune.drafters import ModelDrafter
from spectune.models.hf import load_hf_model
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.sampling import SamplingParams


def full_logits(model: LlamaLM, tokens: list[int]) -> torch.Tensor:
    cache = model.new_cache()
    return model.forward(torch.tensor([tokens]), cache).logits[0]


def test_truncate_and_reappend_matches_recompute(toy_target: LlamaLM) -> None:
    prefix, rejected, replacement = [1, 4, 9, 16, 25], [3, 3, 3, 3], [7, 8]
    cache = toy_target.new_cache()
    toy_target.forward(torch.tensor([prefix]), cache)
    toy_target.forward(torch.tensor([rejected]), cache)
    cache.truncate(len(prefix))
    logits = toy_target.forward(torch.tensor([replacement]), cache).logits[0]
    expected = full_logits(toy_target, prefix + replacement)[len(prefix) :]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert cache.length() == len(prefix) + len(replacement)


def test_ragged_batch_rows_match_single_sequences(toy_target: LlamaLM) -> None:
    rows = [[1, 2, 3, 4, 5, 6], [9, 8, 7]]
    cache = toy_target.new_cache(batch_size=2)
    # Prefill each row alone by writing a padded chunk and truncating the short row.
    width = max(map(len, rows))
    padded = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    toy_target.forward(padded, cache)
    cache.truncate(len(rows[1]), row=1)
    step = torch.tensor([[11, 12], [13, 14]])
    logits = toy_target.forward(step, cache).logits
    for b, row in enumerate(rows):
        expected = full_logits(toy_target, row + step[b].tolist())[len(row) :]
        torch.testing.assert_close(logits[b], expected, atol=1e-5, rtol=1e-5)


def _fresh_proposal(model: LlamaLM, context: list[int], k: int) -> list[int]:
    drafter = ModelDrafter(model)
    return drafter.propose(context, k, SamplingParams(), None).tokens.tolist()


def test_drafter_cache_in_sync_after_full_acceptance(toy_draft: LlamaLM) -> None:
    drafter = ModelDrafter(toy_draft)
    context = [1, 5, 6, 7]
    draft = drafter.propose(context, 4, SamplingParams(), None).tokens.tolist()
    # All four accepted, plus a bonus token: the last draft token was never ingested.
    context = context + draft + [42]
    assert drafter.row.state.ingested[0] == [1, 5, 6, 7] + draft[:3]
    again = drafter.propose(context, 3, SamplingParams(), None).tokens.tolist()
    assert again == _fresh_proposal(toy_draft, context, 3)
    # the context and 2 ingested draft tokens
    assert drafter.row.state.cache.length() == len(context) + 2


def test_drafter_cache_in_sync_after_rejection_at_position_zero(toy_draft: LlamaLM) -> None:
    drafter = ModelDrafter(toy_draft)
    context = [1, 5, 6, 7]
    draft = drafter.propose(context, 4, SamplingParams(), None).tokens.tolist()
    recovered = (draft[0] + 1) % toy_draft.info.vocab_size
    context = context + [recovered]  # nothing accepted: the target's own token
    again = drafter.propose(context, 4, SamplingParams(), None).tokens.tolist()
    assert again == _fresh_proposal(toy_draft, context, 4)
    assert drafter.row.state.ingested[0][: len(context)] == context


def test_a_prefill_for_the_last_logits_alone_leaves_the_same_cache_and_states(
    toy_target: LlamaLM, tmp_path: Path
) -> None:
    """``last_only`` (a prompt's prefill) on the native and transformers runtimes: the last
    position's logits, the same hidden states, and a cache the next step reads alike."""
    save_native(toy_target, tmp_path / "toy")
    prompt, step = torch.tensor([[1, 5, 9, 13, 7, 2, 8]]), torch.tensor([[4, 11]])
    for model in (toy_target, load_hf_model(tmp_path / "toy")):
        caches, outs = [model.new_cache(capacity=16) for _ in range(2)], []
        for cache, last_only in zip(caches, (False, True), strict=True):
            outs.append(model.forward(prompt, cache, last_only=last_only))
        assert outs[1].logits.shape == (1, 1, toy_target.info.vocab_size)
        torch.testing.assert_close(outs[1].logits, outs[0].logits[:, -1:], atol=1e-5, rtol=1e-5)
        assert outs[1].hidden is not None and outs[0].hidden is not None
        assert torch.equal(outs[1].hidden, outs[0].hidden)
        after = [model.forward(step, cache).logits for cache in caches]
        assert torch.equal(after[0], after[1])
