"""Token trees through the transformers adapter: a custom 4-D mask where the model allows it
(full attention), a clear refusal where it does not (sliding windows)."""

from __future__ import annotations

import pytest
import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.draft import tree_layout
from spectune.drafters import ModelDrafter, TreeDrafter, TreeShape
from spectune.drafters.pairing import tree_drafter_for
from spectune.errors import InvalidParameterError
from spectune.models.hf import HFModel, load_hf_model
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.sampling import SamplingParams


@pytest.fixture(scope="module")
def hf_target(toy_target: LlamaLM, tmp_path_factory: pytest.TempPathFactory) -> HFModel:
    folder = tmp_path_factory.mktemp("toy-hf") / "toy"
    save_native(toy_target, folder)
    return load_hf_model(folder)


def test_tree_masked_logits_equal_the_native_runtime(
    hf_target: HFModel, toy_target: LlamaLM
) -> None:
    assert hf_target.tree_masks
    prefix = torch.tensor([[1, 5, 9, 13, 7, 2, 8]])
    parents = torch.tensor([-1, -1, 0, 0, 1, 2])  # the root's chunk: [root, 6 nodes]
    chunk = torch.tensor([[4, 11, 12, 20, 21, 22, 23]])
    positions, mask = tree_layout(parents, prefix.shape[1])
    outputs = []
    for model in (toy_target, hf_target):
        cache = model.new_cache(capacity=32)
        model.forward(prefix, cache)
        out = model.forward(chunk, cache, positions=positions[None], chunk_mask=mask[None])
        outputs.append(out.logits[0])
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", [TreeShape(2, 8), TreeShape(3, 16)])
def test_tree_greedy_through_transformers_equals_target_greedy(
    hf_target: HFModel, toy_draft: LlamaLM, shape: TreeShape
) -> None:
    params = SamplingParams(max_tokens=30)
    accepted = 0
    for prompt in ([1, 5, 9, 13, 7], [1, 22, 23, 24, 25]):
        plain = SpeculativeEngine(hf_target).run(prompt, params, policy=FixedK(0)).tokens
        drafter = tree_drafter_for(ModelDrafter(toy_draft), hf_target, shape)
        gen = SpeculativeEngine(hf_target, drafter).run(prompt, params, policy=FixedK(4))
        assert gen.tokens == plain
        assert all(s.fallback is None for s in gen.steps)
        accepted += gen.accepted
    assert accepted > 0  # paths were accepted, so compaction (move_slots) really ran


def test_sliding_window_models_say_they_cannot_take_trees(
    toy_target: LlamaLM, toy_draft: LlamaLM
) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
    )
    model = HFModel(MistralForCausalLM(config), "tiny-mistral")
    assert not model.tree_masks
    cache = model.new_cache(capacity=16)
    model.forward(torch.tensor([[1, 2, 3]]), cache)
    positions, mask = tree_layout(torch.tensor([-1, -1]), 3)
    with pytest.raises(NotImplementedError, match="native runtime"):
        model.forward(
            torch.tensor([[4, 5, 6]]), cache, positions=positions[None], chunk_mask=mask[None]
        )
    with pytest.raises(InvalidParameterError, match="tree attention mask"):
        tree_drafter_for(ModelDrafter(toy_draft), model, TreeShape(2, 8))
    with pytest.raises(InvalidParameterError, match="draft model"):
        tree_drafter_for(ModelDrafter(model), toy_target, TreeShape(2, 8))
    assert isinstance(
        tree_drafter_for(ModelDrafter(toy_draft), toy_target, TreeShape()), TreeDrafter
    )
