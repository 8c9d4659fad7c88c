"""The llama.cpp backend (``spectune.models.llamacpp``): logits against the native runtime,
rollback, several rows as several sequences, exactness of speculation on it, and what it
refuses. Skipped where the optional ``llama-cpp-python`` is not installed, except the
refusal that says how to install it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from gguf_files import Q, write_gguf
from spectune.cli import main
from spectune.control.base import FixedK
from spectune.decode.batch import BatchEngine
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.model import ModelDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.pairing import Loaded, load_drafter, load_target, tree_drafter_for
from spectune.drafters.tree import TreeShape
from spectune.errors import IncompatibleModelsError, InvalidParameterError, ModelLoadError
from spectune.models.llama import LlamaLM
from spectune.models.llamacpp import (
    LlamaCppCache,
    LlamaCppModel,
    amx_problem,
    llama_cpp_available,
)
from spectune.models.loading import load_model
from spectune.models.shipped import shipped_drafts
from spectune.models.toy import perturbed, toy_config, toy_model
from spectune.sampling import SamplingParams

needs_llama_cpp = pytest.mark.skipif(
    not llama_cpp_available(),
    reason="llama-cpp-python is not installed (pip install 'spectune[llamacpp]')",
)


def _toy() -> LlamaLM:
    """A toy whose shapes llama.cpp's quantised kernels take (rows of 32), with no EOS, so
    every generation runs to max_tokens."""
    cfg = toy_config(vocab_size=96, hidden_size=64, eos_token_id=2)
    return toy_model(5, config=cfg, scale=3.0)


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy as a GGUF with Q8_0 layers (a made-up vocabulary, which llama.cpp needs)."""
    path = tmp_path_factory.mktemp("gguf") / "toy-q8.gguf"
    write_gguf(path, _toy(), Q.Q8_0, vocabulary=True)
    return path


@pytest.fixture(scope="module")
def toy_cpp(toy_file: Path) -> LlamaCppModel:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    model = load_model(toy_file, runtime="llamacpp")
    assert isinstance(model, LlamaCppModel)
    return model


def test_a_missing_extra_is_one_line_saying_how_to_install_it(
    toy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp", None)  # import fails
    with pytest.raises(ModelLoadError, match=r"pip install 'spectune\[llamacpp\]'.*minutes"):
        load_model(toy_file, runtime="llamacpp")


def test_a_build_with_amx_kernels_is_refused_with_the_rebuild_command() -> None:
    # llama_print_system_info of the vendored llama.cpp built with GGML_NATIVE=ON on an
    # Intel Xeon with AMX (which crashed on a 2-token batch), and without AMX.
    native = (
        "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | OPENMP = 1 |"
    )
    without = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 1 | OPENMP = 1 |"
    problem = amx_problem(native)
    assert problem is not None and "\n" not in problem
    assert "AMX" in problem and "-DGGML_NATIVE=OFF" in problem and "pip install" in problem
    assert amx_problem(without) is None


@needs_llama_cpp
def test_llamacpp_describes_the_file_as_the_native_runtime_does(
    toy_cpp: LlamaCppModel, toy_file: Path
) -> None:
    native = load_model(toy_file)
    assert toy_cpp.info == native.info.__class__(
        **{**native.info.__dict__, "num_parameters": toy_cpp.info.num_parameters}
    )
    assert toy_cpp.tree_masks is False


@needs_llama_cpp
def test_toy_logits_match_the_native_runtime_on_the_same_file(
    toy_cpp: LlamaCppModel, toy_file: Path
) -> None:
    """Same Q8_0 file: llama.cpp multiplies Q8_0 weights by Q8_0-quantised activations, the
    native runtime dequantised weights by fp32 ones. Bound: 2% of the logits' spread."""
    native = load_model(toy_file)
    tokens = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(6))
    expected = native.forward(tokens, native.new_cache(1, 32)).logits
    got = toy_cpp.forward(tokens, toy_cpp.new_cache(1, 32)).logits
    assert got.shape == expected.shape
    spread = float(expected.max() - expected.min())
    assert float((got - expected).abs().max()) < 0.02 * spread
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@needs_llama_cpp
def test_rollback_then_the_same_chunk_gives_the_same_logits(toy_cpp: LlamaCppModel) -> None:
    cache = toy_cpp.new_cache(capacity=64)
    toy_cpp.forward(torch.tensor([[1, 5, 9, 13]]), cache)
    first = toy_cpp.forward(torch.tensor([[20, 21, 22]]), cache).logits
    assert cache.length() == 7
    cache.truncate(4)
    again = toy_cpp.forward(torch.tensor([[20, 21, 22]]), cache).logits
    assert torch.equal(first, again)
    # A different chunk after a rollback sees none of the forgotten tokens.
    cache.truncate(4)
    other = toy_cpp.forward(torch.tensor([[30]]), cache).logits
    fresh = toy_cpp.new_cache(capacity=64)
    reference = toy_cpp.forward(torch.tensor([[1, 5, 9, 13, 30]]), fresh).logits[:, -1:]
    torch.testing.assert_close(other, reference, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="cannot truncate"):
        cache.truncate(9)


@needs_llama_cpp
def test_two_rows_are_two_sequences(toy_cpp: LlamaCppModel) -> None:
    """Rows decode as if alone (ragged lengths included); row views and row copies act on
    their own sequence only."""
    prompts = torch.tensor([[1, 5, 9, 13], [1, 40, 41, 42]])
    cache = toy_cpp.new_cache(batch_size=2, capacity=64)
    both = toy_cpp.forward(prompts, cache).logits
    for row in range(2):
        alone = toy_cpp.forward(prompts[row : row + 1], toy_cpp.new_cache(capacity=64)).logits
        torch.testing.assert_close(both[row : row + 1], alone, rtol=0, atol=1e-4)
    cache.truncate(2, 1)  # ragged: row 1 keeps [1, 40]
    view = cache.rows(1, 2)
    step = toy_cpp.forward(torch.tensor([[50]]), view).logits
    cache.lengths[1:2] = view.lengths
    alone = toy_cpp.forward(torch.tensor([[1, 40, 50]]), toy_cpp.new_cache(capacity=64))
    torch.testing.assert_close(step, alone.logits[:, -1:], rtol=0, atol=1e-4)
    assert cache.lengths == [4, 3]
    cache.copy_row(0, 1)
    assert cache.lengths == [4, 4]
    after = toy_cpp.forward(torch.tensor([[7], [7]]), cache).logits
    torch.testing.assert_close(after[0], after[1], rtol=0, atol=1e-5)


@needs_llama_cpp
def test_the_backend_follows_torch_threads_unless_fixed(toy_cpp: LlamaCppModel) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        cache = toy_cpp.new_cache(capacity=16)
        toy_cpp.forward(torch.tensor([[1, 5]]), cache)
        assert isinstance(cache, LlamaCppCache) and cache.context.threads == 1
    finally:
        torch.set_num_threads(before)


@needs_llama_cpp
@pytest.mark.parametrize("k", [1, 3, 6])
def test_speculative_greedy_equals_plain_decoding_on_llamacpp(
    toy_cpp: LlamaCppModel, toy_file: Path, k: int
) -> None:
    """A draft on llama.cpp (the toy, perturbed, written as its own Q8_0 file) and prompt
    lookup: the target's own plain greedy tokens, as the target runs on llama.cpp."""
    draft_file = toy_file.with_name(f"draft-{k}.gguf")
    write_gguf(draft_file, perturbed(_toy(), 0.3), Q.Q8_0, vocabulary=True)
    draft = load_model(draft_file, runtime="llamacpp")
    params = SamplingParams(max_tokens=40)
    for prompt in ([1, 5, 9], [1, 22, 40, 7, 3, 22, 40]):
        plain = SpeculativeEngine(toy_cpp).run(prompt, params, policy=FixedK(0)).tokens
        for drafter in (ModelDrafter(draft), NgramDrafter()):
            gen = SpeculativeEngine(toy_cpp, drafter).run(prompt, params, policy=FixedK(k))
            assert gen.tokens == plain, drafter.name
        assert gen.drafted > 0


@needs_llama_cpp
def test_batched_decoding_on_llamacpp_equals_decoding_alone(toy_cpp: LlamaCppModel) -> None:
    """Three requests through two rows (one joins when another leaves: a row copy), plain
    and with a llama.cpp draft model: each equals its single-sequence greedy output."""
    prompts = [[1, 5, 9], [1, 22, 40, 7], [1, 60, 61]]
    lengths = (12, 30, 20)
    draft = ModelDrafter(toy_cpp)  # the target drafting for itself accepts every token
    for drafting in (None, draft):
        engine = BatchEngine(toy_cpp, drafting, max_batch=2, capacity=64, speculate_max_batch=4)
        outputs: dict[str, list[int]] = {}
        pending = list(enumerate(zip(prompts, lengths, strict=True)))
        while pending or engine.active:
            while pending and engine.has_room:
                i, (prompt, n) = pending.pop(0)
                engine.add(str(i), prompt, SamplingParams(max_tokens=n))
                outputs[str(i)] = []
            for update in engine.step():
                outputs[update.request_id].extend(update.record.emitted)
        for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
            alone = SpeculativeEngine(toy_cpp).run(prompt, SamplingParams(max_tokens=n))
            assert outputs[str(i)] == alone.tokens, (drafting, i)


@needs_llama_cpp
@pytest.mark.slow
def test_sampling_on_llamacpp_is_lossless(toy_cpp: LlamaCppModel) -> None:
    """T = 1: the first two emitted tokens follow the llama.cpp target's own p(t1) p(t2 | t1)
    (chi-square over likely pairs, 3,000 runs, fixed seed, false-failure probability 1e-4),
    with a native float draft that agrees with it often, not always."""
    from tree_checks import first_two_tokens_pvalue

    pvalue, accepted = first_two_tokens_pvalue(
        toy_cpp,  # type: ignore[arg-type]
        ModelDrafter(perturbed(_toy(), 0.3)),
        runs=3_000,
        seed=11,
    )
    assert pvalue > 1e-4, pvalue
    assert accepted > 0


@needs_llama_cpp
def test_trees_and_tree_masks_are_refused(toy_cpp: LlamaCppModel) -> None:
    cache = toy_cpp.new_cache(capacity=16)
    with pytest.raises(NotImplementedError, match="tree attention mask"):
        toy_cpp.forward(
            torch.tensor([[1, 5]]), cache, chunk_mask=torch.ones(1, 2, 2, dtype=torch.bool)
        )
    with pytest.raises(NotImplementedError, match="right after its cached tokens"):
        toy_cpp.forward(torch.tensor([[1, 5]]), cache, positions=torch.tensor([[0, 0]]))
    assert cache.length() == 0
    with pytest.raises(InvalidParameterError, match="cannot take a tree attention mask"):
        tree_drafter_for(NgramDrafter(), toy_cpp, TreeShape(2, 8))


@needs_llama_cpp
def test_other_dtypes_and_non_gguf_models_are_refused(toy_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="leave --dtype at fp32"):
        load_model(toy_file, runtime="llamacpp", dtype=torch.bfloat16)
    with pytest.raises(ModelLoadError, match="runs .gguf files"):
        load_model(tmp_path, runtime="llamacpp")


# --------------------------------------------------------------- the real default target


@pytest.fixture(scope="module")
def default_cpp() -> Loaded:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    return load_target("default", runtime="llamacpp")


@pytest.fixture(scope="module")
def chat_prompt(default_cpp: Loaded) -> list[int]:
    return default_cpp.tokenizer.encode_chat(
        [{"role": "user", "content": "List three facts about the Moon, then repeat them."}]
    )


@needs_llama_cpp
@pytest.mark.slow
def test_default_model_logits_match_the_native_fp32_runtime(
    default_cpp: Loaded, chat_prompt: list[int]
) -> None:
    """Same Q4_1 file on both sides: the native runtime dequantises it and computes in fp32;
    llama.cpp multiplies the Q4_1 blocks by activations quantised to 8 bits (Q8_1) and keeps
    an F16 KV cache. Prefill, a 2-token chunk and one token, every position:

    - the same argmax wherever the native top two logits are >= 0.5 apart (measured on the
      chat prompt and 6 test prompts, 641 positions: argmax agreed at 623; every disagreement
      had a native gap <= 0.19);
    - every logit within 10% of the native logits' spread (measured <= 4.3%; the largest
      differences, up to 2.9, sit at the first positions, whose logits are the largest);
    - the native top token's log-probability within 0.5 (measured <= 0.26)."""
    native = load_target("default").model
    cpp = default_cpp.model
    tokens = torch.tensor([chat_prompt])
    native_cache, cpp_cache = native.new_cache(capacity=256), cpp.new_cache(capacity=256)
    for chunk in (tokens[:, :-3], tokens[:, -3:-1], tokens[:, -1:]):
        a = native.forward(chunk, native_cache).logits[0]  # [chunk, vocab]
        b = cpp.forward(chunk, cpp_cache).logits[0]
        top = a.topk(2, -1).values  # [chunk, 2]
        clear = top[:, 0] - top[:, 1] >= 0.5
        assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])
        spread = a.max(-1).values - a.min(-1).values  # [chunk]
        assert bool(((a - b).abs().max(-1).values <= 0.1 * spread).all())
        best = a.argmax(-1, keepdim=True)
        logprob_error = (a.log_softmax(-1) - b.log_softmax(-1)).gather(-1, best).abs()
        assert float(logprob_error.max()) <= 0.5


@needs_llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("spec", ["ngram", "suffix"])
def test_default_model_speculation_equals_plain_decoding(
    default_cpp: Loaded, chat_prompt: list[int], spec: str
) -> None:
    params = SamplingParams(max_tokens=48)
    target = default_cpp.model
    plain = SpeculativeEngine(target).run(chat_prompt, params).tokens
    drafter = load_drafter(spec, default_cpp)
    gen = SpeculativeEngine(target, drafter).run(chat_prompt, params, policy=FixedK(4))
    assert gen.tokens == plain
    assert gen.drafted > 0


@needs_llama_cpp
@pytest.mark.slow
def test_the_eagle3_head_is_refused_on_llamacpp(
    default_cpp: Loaded, capsys: pytest.CaptureFixture[str]
) -> None:
    heads = shipped_drafts()
    assert heads, "the default target ships an EAGLE-3 head"
    with pytest.raises(IncompatibleModelsError, match="intermediate hidden states"):
        load_drafter(heads[0], default_cpp)
    status = main(
        ["generate", "hi", "--runtime", "llamacpp", "--draft", heads[0], "--max-tokens", "4"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and "--runtime native" in err
