"""Token trees drafted by a feature head (EAGLE-2's setting): the same guarantees as trees
drafted by a model, plus the head's tree-masked scoring equals scoring each path alone."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import FeatureTreeDrafter, ModelDrafter, NgramDrafter, TreeDrafter, TreeShape
from spectune.drafters.base import TargetFeatures
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.pairing import tree_drafter_for
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.toy import toy_config, toy_model
from spectune.sampling import SamplingParams
from tree_checks import (
    assert_width_one_tree_is_the_chain,
    first_two_tokens_pvalue,
    greedy_tree_accepted,
)

ALPHA = 1e-4  # false-failure probability of the chi-square test
PROMPTS = ([1, 5, 9, 13, 7], [1, 22, 23, 24, 25], [9, 4])


@pytest.fixture(scope="module")
def endless() -> LlamaLM:
    """The toy target's weights without an EOS token, so sequences run to max_tokens."""
    config = dataclasses.replace(toy_config(), eos_token_ids=())
    return toy_model(0, config=config, scale=3.0)


def fresh(drafter: FeatureDrafter) -> FeatureDrafter:
    return FeatureDrafter(drafter.head, drafter.vocab_subset, name=drafter.name)


def tree(drafter: FeatureDrafter, shape: TreeShape) -> FeatureTreeDrafter:
    return FeatureTreeDrafter(fresh(drafter), shape)


@pytest.mark.parametrize(
    "shape", [TreeShape(2, 8), TreeShape(3, 16), TreeShape(2, 32, 0.05), TreeShape(4, 64)]
)
def test_feature_tree_greedy_equals_target_greedy(
    endless: LlamaLM, toy_feature_drafter: FeatureDrafter, shape: TreeShape
) -> None:
    accepted = greedy_tree_accepted(
        endless, lambda: tree(toy_feature_drafter, shape), shape, PROMPTS
    )
    assert accepted > 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_width_one_feature_tree_equals_the_feature_chain(
    endless: LlamaLM, toy_feature_drafter: FeatureDrafter, temperature: float
) -> None:
    """Same tokens, same per-step counts, same random numbers (reduced vocabulary too)."""
    assert_width_one_tree_is_the_chain(
        endless,
        lambda: fresh(toy_feature_drafter),
        lambda: tree(toy_feature_drafter, TreeShape(1, 8)),
        temperature,
        PROMPTS,
    )


def test_tree_masked_head_features_equal_each_path_run_alone(
    toy_target: LlamaLM, toy_feature_drafter: FeatureDrafter
) -> None:
    """Every node's head output from the tree-masked forwards equals the head run as a chain
    along that node's path (what drafting the path alone would compute)."""
    prompt = [1, 5, 9, 13, 7]
    hidden = toy_target.forward(torch.tensor([prompt]), toy_target.new_cache()).hidden
    assert hidden is not None  # [1, 5, hidden] the target states the engine would commit
    drafter = tree(toy_feature_drafter, TreeShape(3, 24))
    drafter.commit(prompt, TargetFeatures(0, hidden[0]))
    draft = drafter.propose(prompt, 4, SamplingParams(), None)
    last = drafter._last
    assert draft.parents is not None and last is not None and len(last.tokens) > 6
    head = toy_feature_drafter.head
    checked = 0
    for node, features in drafter._node_features.items():
        path = [node]
        while last.parents[path[-1]] >= 0:
            path.append(last.parents[path[-1]])
        path.reverse()
        alone = fresh(toy_feature_drafter)
        alone.commit(prompt, TargetFeatures(0, hidden[0]))
        state = alone.row.state
        step = state.sync({0: prompt}, 1)[0]
        for member in path:
            token = torch.tensor([[last.tokens[member]]])
            step = head(token, step.view(1, 1, -1), state.cache)[0, -1]
        torch.testing.assert_close(features, step, atol=1e-5, rtol=1e-4)
        checked += 1
    assert checked > 3


@pytest.mark.slow
def test_feature_tree_end_to_end_emits_the_target_distribution(
    toy_target: LlamaLM, toy_feature_drafter: FeatureDrafter
) -> None:
    """The whole path (best-first sampled tree from the head, the engine, the sibling
    verifier): the first two tokens follow the toy target's own distribution. Chi-square over
    the likely (t1, t2) pairs (expected count >= 5; the rest pooled), 4,000 runs, fixed
    seeds, false-failure probability 1e-4."""
    drafter = tree(toy_feature_drafter, TreeShape(width=3, nodes=7))
    runs = 4_000
    pvalue, accepted = first_two_tokens_pvalue(toy_target, drafter, runs=runs, seed=78)
    assert accepted > runs // 4  # the head's tree really was verified, not bypassed
    assert pvalue > ALPHA, pvalue


@pytest.mark.slow
def test_shipped_draft_tree_keeps_the_real_targets_greedy_output(smollm2) -> None:  # type: ignore[no-untyped-def]
    from spectune.drafters.pairing import load_drafter
    from spectune.models.shipped import shipped_draft_path

    if shipped_draft_path("smollm2-draft") is None:
        pytest.skip("no shipped draft in this checkout")
    drafter = load_drafter("smollm2-draft", smollm2)
    prompt = smollm2.tokenizer.encode_chat([{"role": "user", "content": "List three fruits."}])
    params = SamplingParams(max_tokens=24)
    plain = SpeculativeEngine(smollm2.model).run(prompt, params, policy=FixedK(0)).tokens
    for shape in (TreeShape(2, 8), TreeShape(3, 16, 0.02)):
        tree_drafter = tree_drafter_for(drafter, smollm2.model, shape)
        assert isinstance(tree_drafter, FeatureTreeDrafter)
        gen = SpeculativeEngine(smollm2.model, tree_drafter).run(prompt, params, policy=FixedK(4))
        assert gen.tokens == plain
        assert gen.accepted > 0 and all(s.fallback is None for s in gen.steps)


def test_tree_drafter_for_picks_the_tree_form_or_says_why(
    toy_target: LlamaLM, toy_draft: LlamaLM, toy_feature_drafter: FeatureDrafter
) -> None:
    shape = TreeShape(2, 8)
    assert isinstance(tree_drafter_for(ModelDrafter(toy_draft), toy_target, shape), TreeDrafter)
    assert isinstance(
        tree_drafter_for(fresh(toy_feature_drafter), toy_target, shape), FeatureTreeDrafter
    )
    with pytest.raises(InvalidParameterError, match="draft model"):
        tree_drafter_for(NgramDrafter(), toy_target, shape)
    reduced = ModelDrafter(toy_draft, vocab_subset=torch.arange(32))
    with pytest.raises(InvalidParameterError, match="full-vocabulary"):
        tree_drafter_for(reduced, toy_target, shape)
    from spectune.cli.generate import tree_drafter

    args = argparse.Namespace(tree_width=2, tree_nodes=None, tree_min_prob=0.0)
    tree = tree_drafter(fresh(toy_feature_drafter), toy_target, args)
    assert isinstance(tree, FeatureTreeDrafter) and tree.shape == TreeShape(2, 16)


def test_greedy_token_is_the_full_vocabulary_argmax_with_the_heads_own_probability(
    toy_feature_drafter: FeatureDrafter,
) -> None:
    """A greedy draft skips the full-vocabulary rows; its token must still be the argmax of
    ``vocab_logits`` and its confidence the head's own probability of that token, for an
    ascending subset (the fast path) and a shuffled one (the full rows again)."""
    head, subset = toy_feature_drafter.head, toy_feature_drafter.vocab_subset
    assert subset is not None
    shuffled = FeatureDrafter(head, subset.flip(0))
    features = torch.randn(5, head.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    for drafter in (toy_feature_drafter, shuffled):
        for row in features:
            logits = drafter.vocab_logits(row).float()
            token, own = drafter.greedy_token(row)
            assert int(token) == int(logits.argmax())
            assert float(own) == pytest.approx(float(logits.softmax(-1).max()))
