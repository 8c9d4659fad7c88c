"""Suffix trees of the top continuations, and the hybrid's cost rule and merged trees."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from spectune.drafters import ModelDrafter, ScriptedDrafter
from spectune.drafters.hybrid import (
    HybridDrafter,
    SourceStats,
    flat_verify,
    kept_depth,
    merge_trees,
)
from spectune.drafters.pairing import tree_drafter_for
from spectune.drafters.suffix import SuffixDrafter, SuffixSettings, propose_from
from spectune.drafters.suffix_index import SuffixIndex, continuation, continuation_tree
from spectune.drafters.tree import TreeShape
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.records import MAX_K
from spectune.sampling import SamplingParams
from test_suffix import CORPUS, build, greedy_steps, target_corpus


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


def test_tree_flags_reach_suffix_and_hybrid_drafters(toy_target: LlamaLM) -> None:
    shape = TreeShape(width=3, nodes=10, min_path_prob=0.2)
    suffix = tree_drafter_for(SuffixDrafter(build(CORPUS)), toy_target, shape)
    assert isinstance(suffix, SuffixDrafter) and suffix.name == "suffix tree3x10"
    assert (suffix.settings.width, suffix.settings.nodes, suffix.settings.min_prob) == (3, 10, 0.2)
    scripted = ScriptedDrafter(lambda context, k: [7], vocab_size=64, with_probs=False)
    hybrid = HybridDrafter(SuffixDrafter(), scripted, merge_greedy=True)
    tree = tree_drafter_for(hybrid, toy_target, shape)
    assert isinstance(tree, HybridDrafter) and tree.stats is not hybrid.stats and tree.merge_greedy
    assert tree.suffix.settings.width == 3 and tree.name == "suffix tree3x10+scripted"


@pytest.mark.parametrize("k", [2, 4])
def test_suffix_tree_greedy_equals_target_alone(toy_target: LlamaLM, k: int) -> None:
    drafter = SuffixDrafter(target_corpus(toy_target, 0)).with_tree(2, 8, 0.0)
    steps = greedy_steps(toy_target, drafter, k)
    assert sum(step.accepted for step in steps) > 0
    # some trees branched: more nodes than levels
    assert any(
        step.tree_depth is not None and step.num_draft_tokens > step.tree_depth for step in steps
    )


def test_suffix_tree_sampling_stays_lossless(toy_target: LlamaLM) -> None:
    """First two tokens at T = 1 against the target's exact joint distribution (chi-square
    over the likely pairs, 300 runs, fixed seed; fails by chance with probability 1e-4),
    with one-hot trees of width 3 (siblings verified one after another)."""
    from tree_checks import PROMPT, first_two_tokens_pvalue

    drafter = SuffixDrafter(target_corpus(toy_target, 100)).with_tree(3, 12, 0.0)
    first = drafter.suggest(PROMPT, 2)  # the first draft of every run branches
    assert first.parents is not None and len(set(first.parents)) < len(first.parents)
    drafter.reset()
    pvalue, accepted = first_two_tokens_pvalue(toy_target, drafter, runs=300, seed=5)
    assert accepted > 0
    assert pvalue > 1e-4, pvalue


def test_merge_trees_shares_prefixes_and_keeps_the_first_when_cut() -> None:
    model = ([5, 6, 7], None)
    suffix = ([5, 6, 8, 9], [-1, 0, 1, -1])
    assert merge_trees(model, suffix) == ([5, 9, 6, 7, 8], [-1, -1, 0, 2, 2])
    # cut at 4 nodes: the model's chain first, then the suffix's nodes in order
    assert merge_trees(model, suffix, max_nodes=4) == ([5, 6, 7, 8], [-1, 0, 1, 1])
    assert merge_trees(((), None), suffix) == ([5, 9, 6, 8], [-1, -1, 0, 2])


def test_kept_depth_follows_the_branch_the_target_kept() -> None:
    tokens, parents = [5, 9, 6, 7, 8], [-1, -1, 0, 2, 2]
    assert kept_depth(tokens, parents, [5, 6, 8, 1]) == 3
    assert kept_depth(tokens, parents, [9, 6]) == 1
    assert kept_depth(tokens, parents, [4]) == 0
    assert kept_depth([5, 6, 7], None, [5, 6, 3]) == 2


def test_cost_rule_weighs_value_per_cost() -> None:
    stats = SourceStats(decay=0.5)
    stats.observe_model(1, 4)  # 1 of 4 kept: rates 0.75, 0.25, then the 0.5 priors
    assert stats.model_rates[:4] == [0.75, 0.25, 0.5, 0.5]
    assert stats.model_expected(2) == pytest.approx(0.75 + 0.75 * 0.25)
    # free drafting: the longest draft is worth most, 1 + E(4) tokens per step
    length, value = stats.model_choice(4, draft_cost=0.0)
    assert length == 4 and value == pytest.approx(1 + 0.75 + 0.1875 + 0.09375 + 0.046875)
    assert not stats.prefers_suffix(1.07, k=4, draft_cost=0.0)
    assert stats.prefers_suffix(1.08, k=4, draft_cost=0.0)
    # at c = 0.125 one token is best: (1 + 0.75) / 1.125 beats (1 + 0.9375) / 1.25
    length, value = stats.model_choice(4, draft_cost=0.125)
    assert length == 1 and value == pytest.approx(1.75 / 1.125)
    assert stats.prefers_suffix(0.556, k=4, draft_cost=0.125)
    assert not stats.prefers_suffix(0.555, k=4, draft_cost=0.125)
    # measured c: seconds per model token over a target step's seconds
    stats.observe_times(0.01, 0.08)
    assert stats.measured_cost == pytest.approx(0.125)
    assert stats.model_choice(4) == stats.model_choice(4, draft_cost=0.125)


def test_cost_rule_charges_the_targets_verification_curve() -> None:
    """A steep curve (int4-like: v(d) = 1 + 0.15 d) shortens the model's draft and charges
    a suffix draft for its length; a flat one (v = 1) is the rule without a curve."""
    stats = SourceStats(decay=0.5, model_rates=[0.6, 0.6, 0.6, 0.6] + [0.5] * (MAX_K - 4))

    def steep(draft_tokens: int) -> float:
        return 1.0 + 0.15 * draft_tokens

    assert stats.model_choice(4, 0.0) == stats.model_choice(4, 0.0, flat_verify)
    assert stats.model_choice(4, 0.0)[0] == 4
    # E(1) = 0.6, E(2) = 0.96, E(3) = 1.176, E(4) = 1.3056
    length, value = stats.model_choice(4, 0.0, steep)
    assert length == 2 and value == pytest.approx(1.96 / 1.3)
    # a 4-token suffix draft of score 1.4: flat, 2.4 beats the model's 1 + E(4) = 2.31;
    # steep, 2.4 / v(4) = 1.5 loses to the model's 2 tokens, 1.96 / 1.3 = 1.508
    assert stats.choose(1.4, 0.9, 4, 0.0, suffix_nodes=4)[0] == "suffix"
    assert stats.choose(1.4, 0.9, 4, 0.0, suffix_nodes=4, verify=steep) == ("model", 2)
    # merged: the tree's nodes (suffix + model, at most) are charged too
    flat_merged = stats.merged_value(0.5, 0.3, 2, 0.0, suffix_nodes=2)
    steep_merged = stats.merged_value(0.5, 0.3, 2, 0.0, suffix_nodes=2, verify=steep)
    assert steep_merged == pytest.approx(flat_merged / steep(4))


def test_hybrid_drafts_the_models_best_length() -> None:
    """A model whose second token is never kept drafts one token once drafting costs."""
    calls: list[int] = []

    def script(context: Sequence[int], k: int) -> list[int]:
        calls.append(k)
        return [7] * k

    scripted = ScriptedDrafter(script, vocab_size=64, with_probs=False)
    stats = SourceStats(decay=0.5, model_rates=[0.9, 0.0, 0.0, 0.0])
    hybrid = HybridDrafter(SuffixDrafter(), scripted, stats, draft_cost=0.1)
    sampled = SamplingParams(temperature=1.0)  # at 0 the greedy rule chooses (test_suffix)
    assert len(hybrid.propose([1, 2, 3], 4, sampled, None)) == 1
    free = HybridDrafter(SuffixDrafter(), scripted, SourceStats(), draft_cost=0.0)
    assert len(free.propose([1, 2, 3], 4, sampled, None)) == 4
    assert calls == [1, 4]


def test_merged_value_counts_what_the_model_adds_where_the_suffix_fails() -> None:
    stats = SourceStats(decay=0.5, model_rates=[0.4, 0.5] + [0.0] * (MAX_K - 2))
    assert stats.model_choice(2, draft_cost=0.1) == (2, pytest.approx(1.6 / 1.2))
    # a strong suffix draft (score 1, first token 60%): the model adds
    # 0.4 * 0.4 * (0.6 / 0.4) = 0.24 tokens for 2 draft steps -> suffix alone is worth more
    assert stats.merged_value(1.0, 0.6, 2, draft_cost=0.1) == pytest.approx(2.24 / 1.2)
    # a weak one (score 0.3, first token 20%): 0.8 * 0.4 * 1.5 = 0.48 added -> merge
    assert stats.merged_value(0.3, 0.2, 2, draft_cost=0.1) == pytest.approx(1.78 / 1.2)
    assert stats.merged_value(0.3, 0.2, 2, draft_cost=0.1) > 1.3
    stats.observe_rescue(True)  # measured: the model right where the suffix was wrong
    assert stats.model_rescue == pytest.approx(0.7)


def test_hybrid_learns_how_often_the_model_branch_rescues_a_step() -> None:
    scripted = ScriptedDrafter(lambda context, k: [7, 1, 1], vocab_size=64, with_probs=False)
    stats = SourceStats(suffix_accepted_mean=0.5, model_rates=[0.8] * MAX_K)
    # Merging is for a suffix tree's proposal (a chain's goes to the greedy rule).
    tree = SuffixDrafter().tree(TreeShape(width=2, nodes=4))
    hybrid = HybridDrafter(tree, scripted, stats, merge_greedy=True, draft_cost=0.0)
    context = [4, 5, 6, 9, 4, 5]
    draft = hybrid.propose(context, 3, SamplingParams(), None)
    assert sorted(draft.tokens.tolist()) == [1, 1, 6, 7, 9]  # both chains ("7 1 1", "6 9")
    hybrid.commit([*context, 7, 1, 3], None)  # the suffix's "6" rejected, the model's "7 1" kept
    assert stats.model_rescue == pytest.approx(0.9 * 0.8 + 0.1 * 1.0)  # from r_1 = 0.8
    assert stats.model_accepted_total == 2 and stats.suffix_accepted_total == 0


def test_hybrid_measures_the_model_draft_cost() -> None:
    """Scripted clock: the model's propose takes 0.03 s for 3 tokens, the target step
    (propose returned -> commit) 0.05 s, so c = 0.01 / 0.05."""
    ticks = iter([0.0, 0.03, 0.03, 0.08])
    scripted = ScriptedDrafter(lambda context, k: [7, 7, 7], vocab_size=64, with_probs=False)
    hybrid = HybridDrafter(SuffixDrafter(), scripted, clock=lambda: next(ticks))
    hybrid.propose([1, 2, 3], 3, SamplingParams(), None)
    hybrid.commit([1, 2, 3, 7, 5], None)
    assert hybrid.stats.measured_cost == pytest.approx(0.2)
    assert hybrid.stats.model_accepted_total == 1


def test_hybrid_merges_both_drafts_at_temperature_zero_only() -> None:
    # The context repeats "4 5 6": the suffix source proposes "6 ..." after "4 5"; a model
    # step is forced (the model's rate is high, its cost fixed at 0) and the suffix chain
    # is merged in.
    scripted = ScriptedDrafter(lambda context, k: [6, 1, 1], vocab_size=64, with_probs=False)
    stats = SourceStats(suffix_accepted_mean=0.5, model_rates=[1.0] * MAX_K)
    tree = SuffixDrafter().tree(TreeShape(width=2, nodes=4))  # a chain: the greedy rule
    hybrid = HybridDrafter(tree, scripted, stats, merge_greedy=True, draft_cost=0.0)
    context = [4, 5, 6, 9, 4, 5]
    draft = hybrid.propose(context, 3, SamplingParams(), None)
    assert draft.parents is not None
    assert (draft.tokens.tolist(), draft.parents.tolist()) == ([6, 1, 9, 1], [-1, 0, 0, 1])
    hybrid.commit([*context, 6, 9, 4], None)  # the target kept the suffix branch "6 9"
    assert stats.merged_steps == 1 and stats.suffix_accepted_total == 2
    assert stats.model_accepted_total == 1
    sampled = hybrid.propose(context, 3, SamplingParams(temperature=1.0), None)
    assert sampled.parents is None and sampled.tokens.tolist() == [6, 1, 1]


@pytest.mark.parametrize("k", [2, 4])
def test_merged_hybrid_greedy_equals_target_alone(
    toy_target: LlamaLM, toy_draft: LlamaLM, k: int
) -> None:
    """Merged trees (draft cost fixed at 0 so that model steps, hence merges, happen
    whatever the timing), then the same with the cost measured."""
    suffix = SuffixDrafter(target_corpus(toy_target, 0)).with_tree(2, 8, 0.0)
    fixed = HybridDrafter(suffix, ModelDrafter(toy_draft), merge_greedy=True, draft_cost=0.0)
    measured = HybridDrafter(suffix.fresh(), ModelDrafter(toy_draft), merge_greedy=True)
    for hybrid in (fixed, measured):
        greedy_steps(toy_target, hybrid, k)
    assert fixed.stats.merged_steps > 0 and fixed.stats.suffix_steps > 0
    assert measured.stats.measured_cost is not None


def test_hybrid_with_a_suffix_tree_stays_lossless(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    """As test_suffix_tree_sampling_stays_lossless, with model chains (with probabilities)
    and one-hot suffix trees chosen per step, merging switched on (it must not merge at
    T = 1; draft cost fixed so that the choices do not depend on timing): 300 runs, fails by
    chance with probability 1e-4."""
    from tree_checks import first_two_tokens_pvalue

    suffix = SuffixDrafter(target_corpus(toy_target, 100)).with_tree(2, 8, 0.0)
    hybrid = HybridDrafter(suffix, ModelDrafter(toy_draft), merge_greedy=True, draft_cost=0.0)
    pvalue, accepted = first_two_tokens_pvalue(toy_target, hybrid, runs=300, seed=6)
    stats = hybrid.stats
    assert accepted > 0 and stats.suffix_steps > 0 and stats.model_steps > 0
    assert stats.merged_steps == 0
    assert pvalue > 1e-4, pvalue
