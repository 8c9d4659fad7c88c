"""The real default target (SmolLM2-135M-Instruct, fp32): runtime parity and exactness."""

from __future__ import annotations

import pytest
import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import ModelDrafter, NgramDrafter
from spectune.drafters.pairing import Loaded
from spectune.models.llama import LlamaLM, truncated
from spectune.sampling import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat_prompt(smollm2: Loaded) -> list[int]:
    return smollm2.tokenizer.encode_chat(
        [{"role": "user", "content": "List three facts about the Moon, then repeat them."}]
    )


def test_native_logits_match_transformers(smollm2: Loaded, chat_prompt: list[int]) -> None:
    from spectune.models.hf import load_hf_model

    hf = load_hf_model(smollm2.path)
    native = smollm2.model
    tokens = torch.tensor([chat_prompt])
    native_cache, hf_cache = native.new_cache(), hf.new_cache()
    for chunk in (tokens[:, :-3], tokens[:, -3:-1], tokens[:, -1:]):
        a = native.forward(chunk, native_cache).logits
        b = hf.forward(chunk, hf_cache).logits
        assert (a - b).abs().max().item() <= 1e-3
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_equals_target_alone(smollm2: Loaded, chat_prompt: list[int], k: int) -> None:
    assert isinstance(smollm2.model, LlamaLM)
    params = SamplingParams(max_tokens=40)
    reference = SpeculativeEngine(smollm2.model).run(chat_prompt, params).tokens
    for drafter in (ModelDrafter(truncated(smollm2.model, 4)), NgramDrafter()):
        result = SpeculativeEngine(smollm2.model, drafter).run(
            chat_prompt, params, policy=FixedK(k)
        )
        assert result.tokens == reference, drafter.name
        assert result.drafted > 0
