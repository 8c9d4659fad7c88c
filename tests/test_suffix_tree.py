"""Suffix trees of the top continuations."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from spectune.control.base import FixedK
from spectune.drafters.base import Draft, TargetFeatures
from spectune.drafters.suffix import SuffixDrafter, SuffixSettings, propose_from
from spectune.drafters.suffix_index import SuffixIndex, continuation, continuation_tree
from spectune.drafters.tree import TreeShape
from spectune.engine import SpeculativeEngine
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.pairing import tree_drafter_for
from spectune.sampling import SamplingParams
from test_suffix import CORPUS, build, target_corpus


def test_tree_expands_by_frequency_best_first() -> None:
    match = build(CORPUS).find([9])
    assert match is not None
    # 9 -> 1 (3 of 6), 2 (2), 3 (1); width 2 keeps 1 and 2. 1 -> 4 (2), 5 (1); 2 -> 7 (2);
    # 1 4 -> 4 (1, one document ends); 2 7 -> 7 (1), 8 (1). Listed breadth first.
    tree = continuation_tree(match, 3, 0.0, 2, 16)
    assert tree.tokens == [1, 2, 4, 5, 7, 4, 7, 8]
    assert tree.parents == [-1, -1, 0, 0, 1, 2, 4, 4]
    assert tree.probs == pytest.approx([3 / 6, 2 / 6, 2 / 6, 1 / 6, 2 / 6, 1 / 6, 1 / 6, 1 / 6])
    # the node budget keeps the most probable paths (ties: the one found first)
    three = continuation_tree(match, 3, 0.0, 2, 3)
    assert (three.tokens, three.parents) == ([1, 2, 4], [-1, -1, 0])
    # min_prob prunes paths, depth caps them; width 3 admits the third child
    assert continuation_tree(match, 3, 0.3, 2, 16).tokens == [1, 2, 4, 7]
    assert continuation_tree(match, 1, 0.0, 3, 16).tokens == [1, 2, 3]


def test_width_one_is_the_chain_and_paths_have_their_corpus_frequency() -> None:
    rng = np.random.default_rng(11)
    for _ in range(10):
        docs = [rng.integers(0, 4, rng.integers(1, 25)).tolist() for _ in range(10)]
        index = SuffixIndex.build(docs, vocab_size=4, tokenizer="t", max_depth=6)
        for _ in range(20):
            tail = rng.integers(0, 4, rng.integers(1, 6)).tolist()
            match = index.find(tail)
            if match is None:
                continue
            chain = continuation(match, 5, 0.1)
            tree = continuation_tree(match, 5, 0.1, 1, 16)
            assert (tree.tokens, tree.probs) == chain
            assert tree.parents == list(range(-1, len(chain[0]) - 1))
            wide = continuation_tree(match, 4, 0.05, 3, 12)
            assert len(wide.tokens) <= 12
            for node in range(len(wide.tokens)):
                path = _path(wide.tokens, wide.parents, node)
                assert len(path) <= 4 and wide.probs[node] >= 0.05
                follows = [
                    match.tokens[e + 1 : e + 1 + len(path)].tolist() == path for e in match.ends
                ]
                assert wide.probs[node] == pytest.approx(sum(follows) / len(match.ends))


def _path(tokens: Sequence[int], parents: Sequence[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def test_tree_proposal_follows_the_length_rule_and_scores_all_nodes() -> None:
    index = build(CORPUS)
    settings = SuffixSettings(width=2, nodes=16)
    # one matched token: depth 1, whatever K asks; the score sums both paths
    one = propose_from(index.find([9]), 8, settings, "corpus")
    assert one.tokens == [1, 2] and one.parents == [-1, -1]
    assert one.score == pytest.approx(3 / 6 + 2 / 6)
    three = propose_from(index.find([5, 6, 9]), 8, settings, "corpus")
    assert three.tokens == [2, 7, 7, 8] and three.parents == [-1, 0, 1, 1]
    assert three.score == pytest.approx(1 + 1 + 0.5 + 0.5)
    strict = SuffixSettings(width=2, min_prob=0.6)
    assert propose_from(index.find([5, 6, 9]), 8, strict, "corpus").tokens == [2, 7]
    draft = SuffixDrafter(index).with_tree(2, 16).propose([5, 6, 9], 2, SamplingParams(), None)
    assert draft.tokens.tolist() == [2, 7] and draft.parents is not None and draft.probs is None
    with pytest.raises(InvalidParameterError):
        SuffixSettings(width=9)
    with pytest.raises(InvalidParameterError):
        SuffixSettings(width=2, nodes=0)


def test_tree_flags_reach_suffix_drafters(toy_target: LlamaLM) -> None:
    shape = TreeShape(width=3, nodes=10, min_path_prob=0.2)
    suffix = tree_drafter_for(SuffixDrafter(build(CORPUS)), toy_target, shape)
    assert isinstance(suffix, SuffixDrafter) and suffix.name == "suffix tree3x10"
    assert (suffix.settings.width, suffix.settings.nodes, suffix.settings.min_prob) == (3, 10, 0.2)


class Recording:
    """A drafter wrapper that counts the proposed drafts with a branching node."""

    def __init__(self, inner: SuffixDrafter) -> None:
        self.inner = inner
        self.name = inner.name
        self.branching = 0

    def reset(self) -> None:
        self.inner.reset()

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        draft = self.inner.propose(context, num_tokens, params, generator)
        if draft.parents is not None:
            parents = draft.parents.tolist()
            self.branching += len(set(parents)) < len(parents)
        return draft

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        self.inner.commit(context, features)


@pytest.mark.parametrize("k", [2, 4])
def test_suffix_tree_greedy_equals_target_alone(toy_target: LlamaLM, k: int) -> None:
    drafter = Recording(SuffixDrafter(target_corpus(toy_target, 0)).with_tree(2, 8, 0.0))
    greedy = SamplingParams(max_tokens=24)
    accepted = 0
    for prompt in ([1, 5, 9], [1, 9, 9, 12, 30, 9, 9, 12], [3]):
        plain = SpeculativeEngine(toy_target).run(prompt, greedy).tokens
        result = SpeculativeEngine(toy_target, drafter).run(prompt, greedy, policy=FixedK(k))
        assert result.tokens == plain
        assert all(step.fallback is None for step in result.steps)
        accepted += result.accepted
    assert accepted > 0 and drafter.branching > 0


def test_suffix_tree_sampling_stays_lossless(toy_target: LlamaLM) -> None:
    """First two tokens at T = 1 against the target's exact joint distribution (chi-square
    over the likely pairs, 300 runs, fixed seed; fails by chance with probability 1e-4),
    with one-hot trees of width 3 (siblings verified one after another)."""
    from tree_checks import first_two_tokens_pvalue

    drafter = Recording(SuffixDrafter(target_corpus(toy_target, 100)).with_tree(3, 12, 0.0))
    pvalue, accepted = first_two_tokens_pvalue(toy_target, drafter, runs=300, seed=5)
    assert accepted > 0 and drafter.branching > 0
    assert pvalue > 1e-4, pvalue
