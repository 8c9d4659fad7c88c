"""Token trees: layout, verification (greedy tables, chain equivalence), compaction, engine."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.decode.step import check_draft, keep_path
from spectune.draft import Draft, chain_parents, tree_layout, trim_tree
from spectune.drafters import ModelDrafter, TreeDrafter, TreeShape
from spectune.errors import DrafterError, InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.toy import perturbed, toy_config, toy_model
from spectune.sampling import SamplingParams
from spectune.verify.chain import verify_sampled
from spectune.verify.tree import verify_tree_greedy, verify_tree_sampled
from tree_checks import assert_width_one_tree_is_the_chain, greedy_tree_accepted


@pytest.fixture(scope="module")
def endless() -> LlamaLM:
    """The toy target without an EOS token, so sequences run to max_tokens."""
    config = dataclasses.replace(toy_config(), eos_token_ids=())
    return toy_model(0, config=config, scale=3.0)


@pytest.fixture(scope="module")
def endless_draft(endless: LlamaLM) -> LlamaLM:
    return perturbed(endless, 0.3)


def test_layout_of_the_worked_example() -> None:
    """The docstring's tree: "the" -> {"cat" -> {"sat"}, "dog"}, 10 tokens cached."""
    positions, mask = tree_layout(torch.tensor([-1, -1, 0]), 10)
    assert positions.tolist() == [10, 11, 11, 12]
    assert mask.int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]


def test_layout_of_a_deeper_tree() -> None:
    #        root
    #       /    \
    #      0      1
    #     / \     |
    #    2   3    4
    #    |
    #    5
    parents = torch.tensor([-1, -1, 0, 0, 1, 2])
    positions, mask = tree_layout(parents, 3)
    assert positions.tolist() == [3, 4, 4, 5, 5, 5, 6]
    ancestors = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 2, 5}}
    ancestors[6] = {0, 1, 3, 6}
    for row, seen in ancestors.items():
        assert {c for c in range(7) if mask[row, c]} == seen, row


def test_chain_layout_is_causal() -> None:
    positions, mask = tree_layout(chain_parents(4), 7)
    assert positions.tolist() == [7, 8, 9, 10, 11]
    assert torch.equal(mask, torch.ones(5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize(
    "parents, message",
    [([0], "earlier node"), ([-1, 1], "earlier node"), ([-2], "earlier node")],
)
def test_bad_trees_are_drafter_errors(parents: list[int], message: str) -> None:
    tokens = torch.zeros(len(parents), dtype=torch.long)
    with pytest.raises(DrafterError, match=message):
        check_draft(Draft(tokens, None, torch.tensor(parents)), 4, 64)


def test_too_deep_a_tree_is_a_drafter_error() -> None:
    draft = Draft(torch.zeros(3, dtype=torch.long), None, chain_parents(3))
    with pytest.raises(DrafterError, match="deep"):
        check_draft(draft, 2, 64)
    check_draft(draft, 3, 64)


def one_hot_logits(argmax: list[int], vocab: int = 8) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(argmax), vocab).float() * 5


# Tree: root -> {a=3 -> {c=5, d=6}, b=4 -> {e=7}}; node order a, b, c, d, e.
GREEDY_TOKENS = torch.tensor([3, 4, 5, 6, 7])
GREEDY_PARENTS = torch.tensor([-1, -1, 0, 0, 1])


@pytest.mark.parametrize(
    "target_argmax, tokens, path",
    [
        # rows: root, a, b, c, d, e (what the target would emit after each)
        ([3, 6, 0, 0, 1, 0], (3, 6, 1), (1, 4)),  # a then d, then the target's token at d
        ([4, 0, 7, 0, 0, 2], (4, 7, 2), (2, 5)),  # b then e (a leaf): bonus token
        ([4, 0, 1, 0, 0, 2], (4, 1), (2,)),  # b, then a token no child has
        ([2, 6, 0, 0, 1, 0], (2,), ()),  # nothing matches at the root
        ([3, 5, 0, 1, 0, 0], (3, 5, 1), (1, 3)),
    ],
)
def test_greedy_tree_verification_table(
    target_argmax: list[int], tokens: tuple[int, ...], path: tuple[int, ...]
) -> None:
    result = verify_tree_greedy(GREEDY_TOKENS, GREEDY_PARENTS, one_hot_logits(target_argmax))
    assert result.tokens == tokens
    assert result.path == path
    assert result.num_accepted == len(path)


def random_dists(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=generator) * 1.5).softmax(-1)


@pytest.mark.parametrize("with_probs", [True, False])
def test_width_one_tree_is_the_chain_verifier(with_probs: bool) -> None:
    """Same inputs, same seed: the tree verifier decides exactly as the chain verifier."""
    setup = torch.Generator().manual_seed(5)
    for trial in range(300):
        k = trial % 6
        vocab = 6
        draft_probs = random_dists(k, vocab, setup)
        target_probs = random_dists(k + 1, vocab, setup)
        tokens = (
            torch.multinomial(draft_probs, 1, generator=setup).view(-1)
            if k
            else (torch.zeros(0, dtype=torch.long))
        )
        probs = draft_probs if with_probs else None
        chain = verify_sampled(tokens, probs, target_probs, torch.Generator().manual_seed(trial))
        tree = verify_tree_sampled(
            tokens, chain_parents(k), probs, target_probs, torch.Generator().manual_seed(trial)
        )
        assert (tree.tokens, tree.num_accepted, tree.bonus) == (
            chain.tokens,
            chain.num_accepted,
            chain.bonus,
        )
        assert tree.path == chain.path


def test_trim_keeps_a_parents_first_prefix() -> None:
    tokens, probs, parents = trim_tree(GREEDY_TOKENS, None, GREEDY_PARENTS, 3)
    assert tokens.tolist() == [3, 4, 5] and parents.tolist() == [-1, -1, 0] and probs is None


def test_keep_path_equals_recompute(toy_target: LlamaLM) -> None:
    """Compacting a tree's accepted path leaves the cache a fresh prefill would hold."""
    prefix = [1, 7, 9, 11]
    root = 20
    node_tokens = [30, 31, 32, 33, 34, 35]
    parents = torch.tensor([-1, -1, 0, 0, 1, 3])
    path = (1, 4, 6)  # chunk indices: node 0 (30), node 3 (33), node 5 (35)
    cache = toy_target.new_cache(capacity=32)
    toy_target.forward(torch.tensor([prefix]), cache)
    positions, mask = tree_layout(parents, len(prefix))
    toy_target.forward(
        torch.tensor([[root, *node_tokens]]),
        cache,
        positions=positions[None],
        chunk_mask=mask[None],
    )
    keep_path(cache, 0, len(prefix), path)
    kept = [root] + [node_tokens[c - 1] for c in path]
    fresh = toy_target.new_cache(capacity=32)
    toy_target.forward(torch.tensor([prefix + kept]), fresh)
    assert cache.length() == fresh.length() == len(prefix) + len(kept)
    used = fresh.length()
    for layer in range(len(cache.keys)):
        torch.testing.assert_close(cache.keys[layer][:, :, :used], fresh.keys[layer][:, :, :used])
        torch.testing.assert_close(
            cache.values[layer][:, :, :used], fresh.values[layer][:, :, :used]
        )
    # And decoding continues exactly as after a recompute.
    nxt = torch.tensor([[5]])
    torch.testing.assert_close(
        toy_target.forward(nxt, cache).logits, toy_target.forward(nxt, fresh).logits
    )


def test_tree_drafter_commit_compacts_its_own_cache(
    toy_target: LlamaLM, toy_draft: LlamaLM
) -> None:
    drafter = TreeDrafter(toy_draft, TreeShape(width=2, nodes=12))
    context = [1, 5, 9, 13, 7]
    draft = drafter.propose(context, 4, SamplingParams(), None)
    assert draft.parents is not None
    # Accept the deepest path the drafter scored in its last forward, plus one token.
    last = drafter._last  # the grown tree (before the greedy re-rank) and its last chunk
    assert last is not None and last.chunk
    node = max(last.chunk, key=lambda n: (len(_path(last.parents, n)), n))
    accepted = [last.tokens[i] for i in _path(last.parents, node)]
    committed = context + accepted + [3]
    drafter.commit(committed, None)
    cache = drafter.row.state.cache
    assert cache.length() == len(context) + len(accepted)
    fresh = toy_draft.new_cache()
    toy_draft.forward(torch.tensor([context + accepted]), fresh)
    used = fresh.length()
    for layer in range(len(fresh.keys)):
        torch.testing.assert_close(cache.keys[layer][:, :, :used], fresh.keys[layer][:, :, :used])


def _path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_tree_shape_validates() -> None:
    with pytest.raises(InvalidParameterError):
        TreeShape(width=0)
    with pytest.raises(InvalidParameterError):
        TreeShape(nodes=65)
    with pytest.raises(InvalidParameterError):
        TreeShape(min_path_prob=1.0)


@pytest.mark.parametrize(
    "shape",
    [TreeShape(2, 8), TreeShape(3, 16), TreeShape(2, 32, 0.05), TreeShape(4, 64), TreeShape(1, 8)],
)
@pytest.mark.parametrize("eos", [True, False])
def test_tree_greedy_equals_target_greedy(
    request: pytest.FixtureRequest, shape: TreeShape, eos: bool
) -> None:
    toy_target = request.getfixturevalue("toy_target" if eos else "endless")
    toy_draft = request.getfixturevalue("toy_draft" if eos else "endless_draft")
    prompts = ([1, 5, 9, 13, 7], [1, 22, 23, 24, 25], [9])
    accepted = greedy_tree_accepted(
        toy_target, lambda: TreeDrafter(toy_draft, shape), shape, prompts
    )
    assert accepted > 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_width_one_tree_equals_chain_speculation(
    toy_target: LlamaLM, toy_draft: LlamaLM, temperature: float
) -> None:
    assert_width_one_tree_is_the_chain(
        toy_target,
        lambda: ModelDrafter(toy_draft),
        lambda: TreeDrafter(toy_draft, TreeShape(1, 8)),
        temperature,
        ([1, 5, 9, 13, 7], [1, 22, 23, 24, 25], [9]),
    )


@pytest.mark.slow
def test_tree_greedy_equals_target_greedy_on_the_real_model(smollm2) -> None:  # type: ignore[no-untyped-def]
    target = smollm2.model
    draft = perturbed(target, 0.05)  # agrees often, not always (no trained draft needed)
    prompt = smollm2.tokenizer.encode_chat([{"role": "user", "content": "List three fruits."}])
    params = SamplingParams(max_tokens=24)
    plain = SpeculativeEngine(target).run(prompt, params, policy=FixedK(0)).tokens
    for shape in (TreeShape(2, 8), TreeShape(3, 16, 0.02)):
        gen = SpeculativeEngine(target, TreeDrafter(draft, shape)).run(
            prompt, params, policy=FixedK(4)
        )
        assert gen.tokens == plain
        assert gen.accepted > 0 and all(s.fallback is None for s in gen.steps)


def test_greedy_tree_is_reranked_to_the_most_probable_paths(toy_draft: LlamaLM) -> None:
    """At temperature 0 the tree grows past the budget, then keeps the best paths."""
    from spectune.draft import check_parents

    drafter = TreeDrafter(toy_draft, TreeShape(width=2, nodes=4))
    context = [1, 5, 9, 13, 7]
    draft = drafter.propose(context, 4, SamplingParams(), None)
    assert draft.parents is not None and draft.probs is not None and len(draft) == 4
    check_parents(draft.parents, 4)  # ancestor-closed, parents first
    last = drafter._last
    assert last is not None and len(last.tokens) > 4  # it grew past the budget

    # Path probabilities of every grown node, from the draft model itself.
    full = TreeDrafter(toy_draft, TreeShape(width=2, nodes=64))
    grown = full.propose(context, 4, SamplingParams(), None)
    assert grown.parents is not None and grown.probs is not None

    def path_probs(d: Draft) -> list[float]:
        assert d.parents is not None and d.probs is not None
        probs: list[float] = []
        for i, parent in enumerate(d.parents.tolist()):
            own = float(d.probs[i, d.tokens[i]])
            probs.append(own * (1.0 if parent < 0 else probs[parent]))
        return probs

    best = sorted(path_probs(grown), reverse=True)[:4]
    assert sorted(path_probs(draft), reverse=True) == pytest.approx(best)
    # Sampling never re-ranks: the budget stops the growth.
    sampled = drafter.propose(context, 4, SamplingParams(temperature=1.0), None)
    assert len(sampled) <= 4


def test_cli_tree_options_need_a_native_draft_model(
    toy_target: LlamaLM, toy_draft: LlamaLM
) -> None:
    import argparse

    from spectune.cli.generate import tree_drafter
    from spectune.drafters import NgramDrafter

    args = argparse.Namespace(tree_width=3, tree_nodes=None, tree_min_prob=0.0)
    drafter = tree_drafter(ModelDrafter(toy_draft), toy_target, args)
    assert drafter.shape == TreeShape(width=3, nodes=16)
    with pytest.raises(InvalidParameterError, match="draft model"):
        tree_drafter(NgramDrafter(), toy_target, args)
    with pytest.raises(InvalidParameterError, match="tree width"):
        tree_drafter(
            ModelDrafter(toy_draft),
            toy_target,
            argparse.Namespace(tree_width=0, tree_nodes=8, tree_min_prob=0.0),
        )


def test_tree_steps_measure_acceptance_along_the_path(
    toy_target: LlamaLM, toy_draft: LlamaLM
) -> None:
    """A tree keeps at most its depth in tokens, so acceptance is accepted / depth (the
    positions tested), not accepted / nodes: else wide trees would always look bad to the
    controllers and the monitors."""
    from spectune.control.fallback import LocalFallback
    from spectune.records import StepRecord

    gen = SpeculativeEngine(toy_target, TreeDrafter(toy_draft, TreeShape(3, 16))).run(
        [1, 5, 9, 13, 7], SamplingParams(max_tokens=40), policy=FixedK(3)
    )
    trees = [s for s in gen.steps if s.num_draft_tokens]
    assert trees and all(s.tree_depth is not None and s.positions == s.tree_depth for s in trees)
    assert all(s.accepted <= s.positions <= min(3, s.num_draft_tokens) for s in trees)
    assert any(s.positions < s.num_draft_tokens for s in trees)  # wider than deep: the case at hand
    assert gen.acceptance_rate == sum(s.accepted for s in trees) / sum(s.positions for s in trees)
    chain = StepRecord(0, 4, 4, 2, (1, 2, 3), 0.0, 0.0, 0.0)
    assert chain.positions == 4 and chain.tree_depth is None

    # Eight nodes, depth 2, both kept: a perfect step, not a 25% one.
    fallback = LocalFallback()
    perfect_tree = StepRecord(0, 2, 8, 2, (1, 2, 3), 0.0, 0.0, 0.0, tree_depth=2)
    for _ in range(10):
        fallback.observe(perfect_tree)
    assert fallback.check() is None
