"""The one verification entry point (``spectune.verify.draft.verify_draft``) decides as the
references below, written independently of the verifiers' shared pieces.

The references are the chain verifier's cumprod form and the tree verifier's own
residual loop (as they stood before ``spectune.verify.chain`` wrote
``passes``/``residual``/``recovered_from`` once), with the documented random numbers:
acceptance uniforms only for drafts with probabilities, then one target uniform per
output position the step may decide, the token the target draws itself at a position
being its inverse-CDF draw at that number (a one-hot draft token kept when it is that
draw). For the same raw logits and the same seed the entry point must return the same
tokens, the same accepted count and path, and consume the same random numbers.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from spectune.draft import Draft, tree_depths
from spectune.sampling import SamplingParams, process_logits, sample_with
from spectune.verify.chain import VerifyResult, passes, recovered_from, residual
from spectune.verify.draft import verify_draft

VOCAB = 7


def reference_chain(
    tokens: Tensor,
    probs: Tensor | None,
    logits: Tensor,
    params: SamplingParams,
    gen: torch.Generator,
) -> tuple[int, tuple[int, ...], bool]:
    k = tokens.shape[0]
    if params.greedy:
        argmax = logits.argmax(-1)
        matches = (tokens == argmax[:k]).int()
        accepted = int(matches.cumprod(0).sum()) if k else 0
        return accepted, (*tokens[:accepted].tolist(), int(argmax[accepted])), accepted == k
    target = process_logits(logits, params)
    if probs is None:  # one-hot drafts: the target's own draw at each position
        numbers = torch.rand(k + 1, generator=gen)
        drawn = [int(sample_with(target[i], numbers[i])) for i in range(k + 1)]
        accepted = next((i for i in range(k) if drawn[i] != int(tokens[i])), k)
        return accepted, (*tokens[:accepted].tolist(), drawn[accepted]), accepted == k
    rows = torch.arange(k)
    target_at = target[rows, tokens]
    draft_at = probs[rows, tokens]
    uniforms = torch.rand(k, generator=gen)
    numbers = torch.rand(k + 1, generator=gen)
    accepted = int((uniforms * draft_at < target_at).int().cumprod(0).sum()) if k else 0
    if accepted == k:
        last = sample_with(target[k], numbers[k])
    else:
        row = target[accepted]
        left = (row - probs[accepted]).clamp_min(0.0)
        last = sample_with(left if left.sum() > 0 else row, numbers[accepted])
    return accepted, (*tokens[:accepted].tolist(), int(last)), accepted == k


def _normalised(row: Tensor, fallback: Tensor) -> Tensor:
    total = row.sum()
    return row / total if total > 0 else fallback


def reference_tree(
    tokens: Tensor,
    parents: Tensor,
    probs: Tensor | None,
    logits: Tensor,
    params: SamplingParams,
    gen: torch.Generator,
) -> tuple[int, tuple[int, ...], bool, tuple[int, ...]]:
    node_tokens = tokens.tolist()
    children: list[list[int]] = [[] for _ in range(len(node_tokens) + 1)]
    for node, parent in enumerate(parents.tolist()):
        children[parent + 1].append(node + 1)
    path: list[int] = []
    current = 0
    if params.greedy:
        argmax = logits.argmax(-1).tolist()
        while (
            match := next(
                (c for c in children[current] if node_tokens[c - 1] == argmax[current]), None
            )
        ) is not None:
            path.append(match)
            current = match
        emitted = [node_tokens[c - 1] for c in path] + [argmax[current]]
        return len(path), tuple(emitted), not children[current], tuple(path)
    target = process_logits(logits, params)
    uniforms = torch.rand(len(node_tokens), generator=gen) if probs is not None else None
    numbers = torch.rand(max(tree_depths(parents.tolist()), default=0) + 1, generator=gen)
    while True:
        target_row = target[current]
        number = numbers[len(path)]
        kids = children[current]
        if not kids:
            last = sample_with(target_row, number)
            break
        if uniforms is None:  # one-hot children: the target's own draw
            last = sample_with(target_row, number)
            match = next((c for c in kids if node_tokens[c - 1] == int(last)), None)
            if match is None:
                break
            path.append(match)
            current = match
            continue
        accepted: int | None = None
        draft_row = None if probs is None else probs[kids[0] - 1]
        left = target_row
        for j, child in enumerate(kids):
            token = node_tokens[child - 1]
            draft_at = torch.ones(()) if draft_row is None else draft_row[token]
            if bool(uniforms[child - 1] * draft_at < left[token]):
                accepted = child
                break
            if draft_row is None:
                left = left.clone()
                left[token] = 0.0
            else:
                left = (left - draft_row).clamp_min(0.0)
            if j + 1 < len(kids):
                left = _normalised(left, target_row)
                if draft_row is not None:
                    draft_row = draft_row.clone()
                    draft_row[token] = 0.0
                    draft_row = _normalised(draft_row, draft_row)
        if accepted is None:
            last = sample_with(left if left.sum() > 0 else target_row, number)
            break
        path.append(accepted)
        current = accepted
    emitted = [node_tokens[c - 1] for c in path] + [int(last)]
    return len(path), tuple(emitted), not children[current], tuple(path)


def scorer(logits: Tensor, calls: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    def score(start: int, end: int) -> Tensor:
        calls.append((start, end))
        return logits[start:end]

    return score


def as_tuple(result: VerifyResult) -> tuple[int, tuple[int, ...], bool]:
    return result.num_accepted, result.tokens, result.bonus


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.8, top_k=5),
]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "t1", "t0.7-top"])
@pytest.mark.parametrize("with_probs", [True, False])
def test_chain_in_any_number_of_groups_decides_as_before(
    params: SamplingParams, with_probs: bool
) -> None:
    setup = torch.Generator().manual_seed(11)
    for trial in range(150):
        k = trial % 7  # 0 (a plain step) .. 6
        probs = (torch.randn(k, VOCAB, generator=setup) * 1.5).softmax(-1)
        tokens = (
            torch.multinomial(probs, 1, generator=setup).view(-1)
            if k
            else torch.zeros(0, dtype=torch.long)
        )
        logits = torch.randn(k + 1, VOCAB, generator=setup) * 1.5  # raw
        draft = Draft(tokens, probs if with_probs else None)
        expected = reference_chain(
            tokens, draft.probs, logits, params, torch.Generator().manual_seed(trial)
        )
        for groups in range(1, max(k, 1) + 1):
            calls: list[tuple[int, int]] = []
            gen = torch.Generator().manual_seed(trial)
            got = verify_draft(draft, scorer(logits, calls), params, gen, groups=groups)
            assert as_tuple(got) == expected, (trial, groups)
            assert got.path == tuple(range(1, got.num_accepted + 1))
            # The chunk rows were scored in consecutive ranges from 0, one pass per group
            # until the decision.
            assert calls[0][0] == 0
            assert all(a[1] == b[0] for a, b in zip(calls, calls[1:], strict=False))
            assert len(calls) <= groups
            # The same random numbers were consumed as by the one-pass reference.
            check = torch.Generator().manual_seed(trial)
            reference_chain(tokens, draft.probs, logits, params, check)
            assert torch.equal(gen.get_state(), check.get_state())


def random_tree(n: int, gen: torch.Generator) -> Tensor:
    """[n] parents: node i hangs under the root (-1) or an earlier node."""
    return torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)])


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "t1", "t0.7-top"])
@pytest.mark.parametrize("with_probs", [True, False])
def test_tree_decides_as_before(params: SamplingParams, with_probs: bool) -> None:
    setup = torch.Generator().manual_seed(5)
    for trial in range(150):
        n = 1 + trial % 8
        parents = random_tree(n, setup)
        # One draft distribution per parent, shared by its children (what tree drafters give).
        per_parent = (torch.randn(n + 1, VOCAB, generator=setup) * 1.5).softmax(-1)
        probs = per_parent[parents + 1]  # [n, vocab]
        tokens = torch.randint(0, VOCAB, (n,), generator=setup)
        logits = torch.randn(n + 1, VOCAB, generator=setup) * 1.5
        draft = Draft(tokens, probs if with_probs else None, parents)
        expected = reference_tree(
            tokens, parents, draft.probs, logits, params, torch.Generator().manual_seed(trial)
        )
        calls: list[tuple[int, int]] = []
        got = verify_draft(
            draft, scorer(logits, calls), params, torch.Generator().manual_seed(trial)
        )
        assert (*as_tuple(got), got.path) == expected, trial
        assert calls == [(0, n + 1)]  # a tree is scored in one pass, whatever ``groups`` says


def test_the_shared_pieces_on_a_hand_example() -> None:
    """The acceptance test, the residual and the recovery limit every verifier calls."""
    assert passes(
        torch.tensor([0.5, 0.5]), torch.tensor([0.4, 0.0]), torch.tensor([0.1, 0.0])
    ).tolist() == [
        False,
        False,
    ]
    assert passes(torch.tensor([0.2]), torch.tensor([0.5]), torch.tensor([0.2])).tolist() == [True]
    target = torch.tensor([0.5, 0.3, 0.2])
    assert residual(target, torch.tensor([0.2, 0.6, 0.2]), 1).tolist() == pytest.approx(
        [0.3, 0.0, 0.0]
    )
    assert residual(target, None, 0).tolist() == pytest.approx([0.0, 0.3, 0.2])  # one-hot draft
    assert recovered_from(torch.zeros(3), target) is target  # no residual mass: the target row
