"""``--device auto|cpu|cuda``: resolution, the one-line error without a GPU, and (marked
``gpu``, skipped where torch sees none) decoding on CUDA equal to decoding on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from spectune.cli import main
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.model import ModelDrafter
from spectune.errors import InvalidParameterError, ModelLoadError
from spectune.models.devices import resolve_device
from spectune.models.llama import LlamaLM
from spectune.models.loading import load_model
from spectune.sampling import SamplingParams

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")


def test_cpu_and_auto_resolve_without_a_gpu() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    # int8 / int4 kernels are CPU kernels: auto keeps them there even with a GPU.
    assert resolve_device("auto", cpu_kernels=True) == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(InvalidParameterError, match="unknown device"):
        resolve_device("tpu")


@no_gpu
def test_cuda_without_a_gpu_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidParameterError, match="no CUDA GPU"):
        resolve_device("cuda")
    for argv in (
        ["generate", "hello", "--device", "cuda", "--max-tokens", "2"],
        ["bench", "--device", "cuda", "--systems", "plain"],
        ["select", "ngram", "--device", "cuda"],
        ["distill", "--device", "cuda", "--steps", "1", "--corpus", "x", "--out", "y"],
        ["serve", "--device", "cuda"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "no CUDA GPU" in err, (argv, err)


def test_quantised_models_refuse_a_gpu() -> None:
    with pytest.raises(ModelLoadError, match="CPU kernels"):
        load_model("default", quantize="int4", device="cuda")


def _on(model: LlamaLM, device: str) -> LlamaLM:
    return LlamaLM(copy.deepcopy(model.net).to(device), name=model.info.name)


@pytest.mark.gpu
def test_greedy_on_cuda_equals_plain_cuda_and_cpu(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    """Speculative greedy output on CUDA equals plain greedy on CUDA (token for token), and
    the toy target's CUDA logits match the CPU's (outputs come back on the CPU)."""
    target, draft = _on(toy_target, "cuda"), _on(toy_draft, "cuda")
    tokens = torch.tensor([[1, 5, 9, 13]])
    on_gpu = target.forward(tokens, target.new_cache(capacity=8)).logits
    on_cpu = toy_target.forward(tokens, toy_target.new_cache(capacity=8)).logits
    assert on_gpu.device.type == "cpu"
    torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-3, atol=1e-3)
    params = SamplingParams(max_tokens=40)
    for prompt in ([1, 5, 9], [1, 22, 40, 7, 3]):
        plain = SpeculativeEngine(target).run(prompt, params, policy=FixedK(0)).tokens
        for k in (1, 4):
            engine = SpeculativeEngine(target, ModelDrafter(draft))
            assert engine.run(prompt, params, policy=FixedK(k)).tokens == plain


@pytest.mark.gpu
def test_sampling_on_cuda_draws_the_cpu_seeds_numbers(toy_target: LlamaLM) -> None:
    """Randomness stays on the CPU generator: the same seed gives the same tokens on CUDA
    as on the CPU when the logits agree (toy model, T = 0.8, a few prompts)."""
    target = _on(toy_target, "cuda")
    params = SamplingParams(temperature=0.8, max_tokens=8)
    prompt = [1, 5, 9]
    gpu_run = SpeculativeEngine(target).run(
        prompt, params, generator=torch.Generator().manual_seed(3)
    )
    cpu_run = SpeculativeEngine(toy_target).run(
        prompt, params, generator=torch.Generator().manual_seed(3)
    )
    assert gpu_run.tokens == cpu_run.tokens


@pytest.mark.gpu
@pytest.mark.slow
def test_default_model_greedy_on_cuda_matches_speculation() -> None:
    from spectune.drafters.ngram import NgramDrafter
    from spectune.drafters.pairing import load_target

    loaded = load_target("default", device="cuda")
    prompt = loaded.tokenizer.encode("The capital of France is Paris. The capital of France is")
    params = SamplingParams(max_tokens=32)
    plain = SpeculativeEngine(loaded.model).run(prompt, params, policy=FixedK(0)).tokens
    spec = SpeculativeEngine(loaded.model, NgramDrafter()).run(prompt, params, policy=FixedK(4))
    assert spec.tokens == plain
