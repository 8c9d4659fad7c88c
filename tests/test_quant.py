"""Weight-only quantised execution: the kernels' convention, GGUF Q4_0 / Q4_1 / Q8_0 blocks
mapped onto them, and losslessness relative to the quantised target as it runs."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from unittest import mock

import gguf
import numpy as np
import pytest
import torch

from gguf_files import write_gguf
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.model import ModelDrafter
from spectune.errors import ModelLoadError
from spectune.models import quant
from spectune.models.llama import Block, LlamaLM
from spectune.models.loading import load_model
from spectune.models.quant import (
    Int4Codes,
    Int4Linear,
    Int8Linear,
    int4_codes_from_float,
    int4_codes_from_gguf,
    int8_codes_from_float,
    quantize_net,
)
from spectune.models.toy import perturbed, toy_config, toy_model
from spectune.sampling import SamplingParams

Q = gguf.GGMLQuantizationType
# The kernels take bf16 inputs and round their outputs to bf16 (8 significant bits): an
# output may differ from the fp32 matmul of the same bf16 inputs by 2^-9 of the sum of its
# terms' magnitudes; the bound allows twice that (accumulation order). Measured: <= 2^-9.8.
KERNEL_BOUND = 2.0**-8


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


def assert_kernel_close(
    out: torch.Tensor,  # [..., out] the layer's output
    x: torch.Tensor,  # [..., in]
    weight: torch.Tensor,  # [out, in] the weights the layer stands for (bf16-rounded)
    bias: torch.Tensor | None = None,  # [out]
) -> None:
    expected = _bf16(x) @ weight.T
    magnitude = _bf16(x).abs() @ weight.abs().T
    if bias is not None:
        expected, magnitude = expected + bias, magnitude + bias.abs()
    excess = (out - expected).abs() - KERNEL_BOUND * magnitude
    assert float(excess.max()) <= 1e-6, float(excess.max())


def _weights(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))


def test_int4_kernel_dequantises_as_code_minus_8_times_scale_plus_zero() -> None:
    """The module docstring's convention, against this PyTorch: the layer equals x W^T for
    W = (code - 8) * scale + zero, with x, scale and zero rounded to bf16 as the kernel
    stores them."""
    generator = torch.Generator().manual_seed(0)
    codes = Int4Codes(
        torch.randint(0, 16, (48, 96), generator=generator, dtype=torch.uint8),
        torch.rand(48, 3, generator=generator) + 0.1,
        torch.randn(48, 3, generator=generator),
    )
    bias = torch.randn(48, generator=generator)
    layer = Int4Linear(codes, bias)
    x = torch.randn(2, 5, 96, generator=generator)  # [batch, chunk, in]
    reference = Int4Codes(codes.codes, _bf16(codes.scales), _bf16(codes.zeros)).dequantized()
    assert_kernel_close(layer(x), x, reference, bias)
    assert layer(x).shape == (2, 5, 48) and layer(x).dtype == torch.float32
    torch.testing.assert_close(layer.weight, reference, rtol=2.0**-8, atol=0.0)


def test_int8_layer_matches_its_dequantised_matmul() -> None:
    weight = _weights(32, 64, 1)
    codes, scales = int8_codes_from_float(weight)
    layer = Int8Linear(codes, scales)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    assert_kernel_close(layer(x), x, codes.float() * _bf16(scales)[:, None])
    # Symmetric per-row int8: at most half a step from the float weights.
    step = weight.abs().amax(dim=1, keepdim=True) / 127
    assert ((codes.float() * scales[:, None] - weight).abs() <= step / 2 + 1e-6).all()


def test_float_weights_quantise_to_int4_within_half_a_step() -> None:
    weight = _weights(16, 64, 3)
    codes = int4_codes_from_float(weight)
    step = codes.scales.repeat_interleave(32, dim=1)
    assert ((codes.dequantized() - weight).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1])
def test_gguf_4bit_blocks_map_exactly_onto_int4_codes(kind: Q) -> None:
    """Blocks written by the gguf package read back as codes whose dequantised weights are
    the package's own dequantisation (fp32 rounding of m + 8 d aside)."""
    weight = _weights(32, 96, 4).numpy()
    blocks = gguf.quants.quantize(weight, kind)  # [out, in / 32 * block bytes] uint8
    codes = int4_codes_from_gguf(blocks, kind.name)
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, kind).reshape(weight.shape))
    torch.testing.assert_close(codes.dequantized(), expected, rtol=1e-6, atol=1e-6)
    assert int(codes.codes.max()) <= 15


def _quantisable_toy() -> LlamaLM:
    """Toy model whose shapes the int4 kernel takes (out % 16, in % 32)."""
    return toy_model(5, config=toy_config(vocab_size=96, hidden_size=64), scale=3.0)


@pytest.mark.parametrize("layer_type", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_gguf_file_runs_quantised_close_to_its_dequantised_model(
    tmp_path: Path, layer_type: Q
) -> None:
    """Q4 layers go to int4 as stored, Q8_0 ones (and the tied Q8_0 head) to int8: the
    logits stay within bf16-activation error of the dequantised fp32 model. Bound: 2% of
    the logits' spread (measured: ~0.3%)."""
    path = tmp_path / f"toy-{layer_type.name}.gguf"
    write_gguf(path, _quantisable_toy(), layer_type)
    dense = load_model(path)
    quantised = load_model(path, quantize="int4")
    assert isinstance(quantised, LlamaLM)
    kinds = {type(m).__name__ for m in quantised.net.modules()}
    assert ("Int4Linear" in kinds) == (layer_type != Q.Q8_0) and "Int8Linear" in kinds
    assert "Linear" not in kinds
    tokens = torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(6))
    expected = dense.forward(tokens, dense.new_cache(2, 16)).logits
    got = quantised.forward(tokens, quantised.new_cache(2, 16)).logits
    spread = float(expected.max() - expected.min())
    assert float((got - expected).abs().max()) < 0.02 * spread


def test_quantize_needs_the_native_runtime_and_a_known_mode(tmp_path: Path) -> None:
    path = tmp_path / "toy.gguf"
    write_gguf(path, _quantisable_toy(), Q.Q4_1)
    with pytest.raises(ModelLoadError, match="unknown quantization"):
        load_model(path, quantize="int3")  # type: ignore[arg-type]


def _quantised(model: LlamaLM, mode: str) -> LlamaLM:
    """``mode``: int8, int4, or "int8-split": int8 with every layer on oneDNN's split path
    (which otherwise only layers of ``SPLIT_MIN_WEIGHTS`` weights take)."""
    net = copy.deepcopy(model.net)
    threshold = 0 if mode == "int8-split" else quant.SPLIT_MIN_WEIGHTS
    with mock.patch.object(quant, "SPLIT_MIN_WEIGHTS", threshold):
        quantize_net(net, mode.removesuffix("-split"))  # type: ignore[arg-type]
    return LlamaLM(net, name=f"{model.info.name}-{mode}")


def test_a_large_int8_layer_runs_on_onednn_with_its_activations_split_in_two_rows() -> None:
    """Layers of ``SPLIT_MIN_WEIGHTS`` weights (the default model's output head): each row
    is split into ``high + low / 254`` int8 rows and multiplied exactly, so the output is the
    float matmul up to the split's rounding (at most peak / 64,516 per activation) and fp32
    arithmetic; the same bits whatever the rows beside it; and ``.weight`` gives the codes
    times their fp32 scales."""
    out_features, in_features = 8192, 512
    assert out_features * in_features == quant.SPLIT_MIN_WEIGHTS
    codes, scales = int8_codes_from_float(_weights(out_features, in_features, 3))
    layer = Int8Linear(codes, scales)
    if not quant.exact_int8_gemm():  # no VNNI: oneDNN's int8 sums would saturate
        assert layer.onednn is None
        pytest.skip("this CPU has no VNNI (avx512_vnni / avx_vnni): the layer stays on int8pack")
    assert layer.onednn is not None  # x86 builds of PyTorch carry oneDNN
    weight = codes.double() * scales.double()[:, None]  # [out, in]
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(9, in_features, generator=gen) * torch.rand(1, in_features, generator=gen)
    out = layer(x)
    peak = x.abs().amax(dim=1, keepdim=True).double()
    split_error = peak / (127 * 254 * 2) * weight.abs().sum(dim=1)  # [rows, out]
    float_error = 1e-6 * (x.double().abs() @ weight.abs().T)
    excess = (out.double() - x.double() @ weight.T).abs() - split_error - float_error
    assert float(excess.max()) <= 0.0, float(excess.max())
    for count in range(1, 10):  # batch invariance, bit for bit
        assert torch.equal(layer(x[:count]), out[:count])
        assert torch.equal(layer(x[count - 1 : count]), out[count - 1 : count])
    assert torch.allclose(layer.weight.double(), weight, rtol=1e-6, atol=0.0)
    edge = torch.zeros(2, in_features)
    edge[1, 0] = float("nan")
    got = layer(edge)
    assert torch.equal(got[0], torch.zeros(out_features)) and not got[1].isfinite().any()


def test_a_small_int8_layer_stays_on_int8pack() -> None:
    codes, scales = int8_codes_from_float(_weights(32, 64, 1))
    assert Int8Linear(codes, scales).onednn is None


@pytest.mark.parametrize("mode", ["int8", "int4", "int8-split"])
def test_speculative_greedy_equals_the_quantised_target(toy_target: LlamaLM, mode: str) -> None:
    """Losslessness is relative to the target as it runs: the quantised target's own plain
    greedy output, for a float draft and a quantised one, several K."""
    target = _quantised(toy_target, mode)
    drafts = [perturbed(toy_target, 0.3), _quantised(perturbed(toy_target, 0.3), mode)]
    params = SamplingParams(max_tokens=40)
    for prompt in ([1, 5, 9], [1, 22, 40, 7, 3]):
        plain = SpeculativeEngine(target).run(prompt, params, policy=FixedK(0)).tokens
        for draft in drafts:
            for k in (1, 3, 6):
                engine = SpeculativeEngine(target, ModelDrafter(draft))
                assert engine.run(prompt, params, policy=FixedK(k)).tokens == plain


@pytest.mark.slow
def test_sampling_from_a_quantised_target_is_lossless() -> None:
    """T = 1: the first two emitted tokens follow the int4 target's own p(t1) p(t2 | t1)
    (chi-square over likely pairs, 3,000 runs, fixed seed, false-failure probability
    1e-4), with a float draft that agrees with it often, not always. No EOS, so every run
    emits two tokens."""
    from tree_checks import first_two_tokens_pvalue

    toy = toy_model(0, config=dataclasses.replace(toy_config(), eos_token_ids=()), scale=3.0)
    target = _quantised(toy, "int4")
    pvalue, accepted = first_two_tokens_pvalue(
        target, ModelDrafter(perturbed(toy, 0.3)), runs=3_000, seed=11
    )
    assert pvalue > 1e-4, pvalue
    assert accepted > 0


def test_quantised_weights_are_readable_by_weight_sharers() -> None:
    """A feature head reads the target's output rows through ``.weight``."""
    model = _quantised(_quantisable_toy(), "int4")
    head = model.net.lm_head
    assert isinstance(head, Int4Linear)
    assert head.weight.shape == (96, 64)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    assert_kernel_close(head(x), x, head.weight)


def test_int4_codes_reject_shapes_the_kernel_cannot_take() -> None:
    with pytest.raises(ValueError, match="out % 16"):
        Int4Linear(int4_codes_from_float(torch.randn(8, 32)))
    # quantize_net falls back to int8 for such a layer.
    net = torch.nn.Sequential(torch.nn.Linear(32, 8))
    assert quantize_net(net, "int4") == 1
    assert isinstance(net[0], Int8Linear)


def test_gguf_blocks_of_the_wrong_size_are_refused() -> None:
    with pytest.raises(ValueError):
        int4_codes_from_gguf(np.zeros((16, 19), dtype=np.uint8), "Q4_1")


def _blocks(net: torch.nn.Module) -> list[Block]:
    return [block for block in net.modules() if isinstance(block, Block)]


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantised_model_runs_fused_and_equals_its_unfused_self(mode: str) -> None:
    """q, k, v (and gate, up) in one kernel call: the logits are the separate layers',
    bit for bit (a kernel computes every output row on its own), and the old names still
    answer with their slice of the stacked layer."""
    toy = _quantisable_toy()
    model = _quantised(toy, mode)
    unfused = _quantised(toy, mode)
    for block in _blocks(unfused.net):  # the fast path off: the parts answer alone
        block.self_attn.qkv = None
        block.mlp.gate_up = None
    assert all(
        b.self_attn.qkv is not None and b.mlp.gate_up is not None for b in _blocks(model.net)
    )
    tokens = torch.tensor([[1, 5, 9, 22, 40]])
    got = model.forward(tokens, model.new_cache(capacity=8)).logits
    want = unfused.forward(tokens, unfused.new_cache(capacity=8)).logits
    assert torch.equal(got, want)
    alone = torch.nn.Sequential(copy.deepcopy(_blocks(toy.net)[0].self_attn.k_proj))
    quantize_net(alone, mode)  # type: ignore[arg-type]
    part = _blocks(model.net)[0].self_attn.k_proj
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(part(x), alone(x))
    assert torch.equal(part.weight, alone[0].weight)  # type: ignore[arg-type]


def test_siblings_on_different_kernels_stay_apart() -> None:
    """An int8 k (a Q8_0 tensor in an int4 model) keeps q, k and v separate."""
    net = copy.deepcopy(_quantisable_toy().net)
    quantize_net(net, "int4", int8_names=frozenset({"layers.0.self_attn.k_proj"}))
    first, second = _blocks(net)[:2]
    assert first.self_attn.qkv is None and second.self_attn.qkv is not None
    assert isinstance(first.self_attn.k_proj, Int8Linear)


def _one_at_a_time(model: LlamaLM, prefix: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits of ``tokens`` after ``prefix``, fed one token per forward (plain decoding)."""
    cache = model.new_cache(capacity=32)
    model.forward(torch.tensor([prefix]), cache)
    rows = [model.forward(torch.tensor([[t]]), cache).logits[0, 0] for t in tokens]
    return torch.stack(rows)


@pytest.mark.parametrize("mode", ["int8", "int4", "int8-split"])
def test_a_quantised_position_scores_alike_alone_and_beside_others(mode: str) -> None:
    """Batch invariance: on the weight-only kernels a position's logits are the same bits
    in a verification chunk, in a ragged batch and in a token tree as in one-token
    decoding, so speculative greedy output cannot drift from plain greedy output."""
    model = _quantised(_quantisable_toy(), mode)
    assert model.batch_invariant
    prefix, chunk = [1, 5, 9, 22], [40, 7, 3, 61, 12, 8]
    alone = _one_at_a_time(model, prefix, chunk)
    cache = model.new_cache(capacity=32)
    model.forward(torch.tensor([prefix]), cache)
    assert torch.equal(model.forward(torch.tensor([chunk]), cache).logits[0], alone)

    # Ragged batch: a second, longer sequence beside the first.
    other_prefix = [1, 30, 31, 32, 33, 34, 35]
    batch = model.new_cache(batch_size=2, capacity=32)
    first = model.new_cache(capacity=32)
    model.forward(torch.tensor([prefix]), first)
    second = model.new_cache(capacity=32)
    model.forward(torch.tensor([other_prefix]), second)
    for row, held in enumerate((first, second)):
        for layer in range(len(batch.keys)):
            batch.keys[layer][row] = held.keys[layer][0]
            batch.values[layer][row] = held.values[layer][0]
        batch.lengths[row] = held.lengths[0]
    got = model.forward(torch.tensor([chunk[:3], chunk[3:]]), batch).logits
    assert torch.equal(got[0], alone[:3])
    assert torch.equal(got[1], _one_at_a_time(model, other_prefix, chunk[3:]))

    # Token tree: node 0, its children 1 and 2, and 3 under 2; path 0-2-3 as plain decoding.
    parents = [-1, 0, 0, 2]
    seen = torch.zeros(1, 4, 4, dtype=torch.bool)
    depth = []
    for node, parent in enumerate(parents):
        seen[0, node, node] = True
        if parent >= 0:
            seen[0, node] |= seen[0, parent]
        depth.append(0 if parent < 0 else depth[parent] + 1)
    tree = model.new_cache(capacity=32)
    model.forward(torch.tensor([prefix]), tree)
    nodes = [chunk[0], chunk[1], chunk[2], chunk[3]]
    positions = torch.tensor([[len(prefix) + d for d in depth]])
    scored = model.forward(
        torch.tensor([nodes]), tree, positions=positions, chunk_mask=seen
    ).logits[0]
    path = _one_at_a_time(model, prefix, [nodes[0], nodes[2], nodes[3]])
    assert torch.equal(scored[[0, 2, 3]], path)


def test_dtype_auto_runs_a_4_bit_gguf_on_int4_and_anything_else_on_fp32(tmp_path: Path) -> None:
    """``--dtype auto``: the int4 kernel where the file's layers are Q4_0/Q4_1 blocks on the
    native runtime and the CPU; fp32 for 8-bit files, llama.cpp, a GPU and model folders."""
    from spectune.cli.common import auto_precision
    from spectune.models.loading import save_native

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for layer_type, expected in ((Q.Q4_1, "int4"), (Q.Q4_0, "int4"), (Q.Q8_0, "fp32")):
        path = tmp_path / f"toy-{layer_type.name}.gguf"
        write_gguf(path, _quantisable_toy(), layer_type)
        assert auto_precision(str(path), "auto", cpu).name == expected
    four_bit = str(tmp_path / "toy-Q4_1.gguf")
    assert auto_precision(four_bit, "llamacpp", cpu).name == "fp32"
    assert auto_precision(four_bit, "auto", cuda).name == "fp32"
    save_native(_quantisable_toy(), tmp_path / "folder")
    assert auto_precision(str(tmp_path / "folder"), "auto", cpu).name == "fp32"
    assert auto_precision("default", None, cpu).name == "int4"  # SmolLM2's Q4_1 file


def test_choosing_and_loading_a_gguf_parses_it_once_then_never_until_it_changes(
    tmp_path: Path,
) -> None:
    """``--dtype auto`` reads the file's header alone (``spectune.models.facts``); the int4
    load asks it for weights and int4 codes: one parse (3.5 s on the default model) serves
    both, the answers are cached, so the next start parses nothing and runs the same model,
    and a file written since is read anew."""
    import gguf

    from spectune.cli.common import auto_precision

    path = tmp_path / "toy.gguf"
    write_gguf(path, _quantisable_toy(), Q.Q4_1)
    tokens = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    logits = []
    with mock.patch.object(gguf, "GGUFReader", wraps=gguf.GGUFReader) as reader:
        for _ in range(2):
            assert auto_precision(str(path), "auto", torch.device("cpu")).name == "int4"
            model = load_model(path, quantize="int4")
            assert reader.call_count == 1
            logits.append(model.forward(tokens, model.new_cache(1, 16)).logits)
        write_gguf(path, _quantisable_toy(), Q.Q8_0)
        assert auto_precision(str(path), "auto", torch.device("cpu")).name == "fp32"
        assert reader.call_count == 1
        load_model(path)
        assert reader.call_count == 2
    assert torch.equal(logits[0], logits[1])


def test_a_damaged_gguf_cache_is_read_from_the_file_again(tmp_path: Path) -> None:
    from spectune.models.cache_dir import derived_path

    path = tmp_path / "toy.gguf"
    write_gguf(path, _quantisable_toy(), Q.Q4_1)
    tokens = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    first = load_model(path, quantize="int4")
    expected = first.forward(tokens, first.new_cache(1, 16)).logits
    (derived_path(path, "gguf-int4") / "layers.safetensors").write_bytes(b"{not safetensors")
    model = load_model(path, quantize="int4")
    assert torch.equal(model.forward(tokens, model.new_cache(1, 16)).logits, expected)


def test_a_quantised_feature_head_runs_on_the_kernels_as_its_weights_say() -> None:
    """``FeatureHead.quantize``: every linear layer and the output rows on the kernel, and
    the head computes what a float head holding the quantised weights (``.weight``)
    computes, up to the kernels' bf16 activations: within 1% of the logits' spread
    (measured 0.3%). (How much 4-bit weights move a trained head's drafts is measured on
    the real pair, not here: random weights quantise worse than trained ones.)"""
    from spectune.distill.models import DraftArchitecture, FeatureDraftModel

    toy = _quantisable_toy()
    arch = DraftArchitecture(kind="feature", intermediate_size=64)
    subset = torch.arange(0, 96, 2)  # a reduced vocabulary of 48 rows
    head = FeatureDraftModel.create(arch, toy.net, subset, torch.Generator().manual_seed(3)).head
    quantised = copy.deepcopy(head)
    quantised.quantize("int4")
    kinds = {type(m).__name__ for m in quantised.modules()}
    assert "Linear" not in kinds and "Int4Linear" in kinds
    assert isinstance(quantised.output, Int4Linear)
    reference = copy.deepcopy(head)
    layers = dict(quantised.named_modules())
    with torch.no_grad():
        for name, module in reference.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(layers[name].weight)
        reference.output_weight.copy_(quantised.output.weight)
    tokens = torch.randint(3, 96, (2, 10), generator=torch.Generator().manual_seed(4))
    prev = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = reference.logits(reference(tokens, prev))
        got = quantised.logits(quantised(tokens, prev))
    assert got.shape == expected.shape == (2, 10, 48)
    spread = float(expected.max() - expected.min())
    assert float((got - expected).abs().max()) < 0.01 * spread


@pytest.mark.slow
def test_the_shipped_head_drafts_on_the_int4_targets_kernels_and_keeps_greedy_output() -> None:
    from spectune.drafters.feature import FeatureDrafter
    from spectune.drafters.pairing import load_drafter, load_target_at

    target = load_target_at("default", "int4")
    drafter = load_drafter("smollm2-draft", target)
    assert isinstance(drafter, FeatureDrafter)
    assert isinstance(drafter.head.output, Int4Linear)
    assert isinstance(drafter.head.fc, Int4Linear)
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": "Name three colours."}])
    params = SamplingParams(max_tokens=32)
    model = target.model
    plain = SpeculativeEngine(model).run(prompt, params, policy=FixedK(0)).tokens
    run = SpeculativeEngine(model, drafter).run(prompt, params, policy=FixedK(3))
    assert run.tokens == plain
    assert sum(step.accepted for step in run.steps) > 0  # it drafts, and some drafts land


def test_draft_models_take_the_quantised_targets_kernels_alone_and_in_a_hybrid(
    tmp_path: Path,
) -> None:
    """Wherever a draft model is loaded beside an int8 / int4 target (generate, bench,
    select, experiments, a hybrid's model branch) it runs on the same kernels."""
    from bench_fixtures import make_models
    from spectune.drafters.hybrid import HybridDrafter
    from spectune.drafters.pairing import load_drafter, load_drafter_at, load_target_at

    target_dir, draft_dir = make_models(tmp_path)
    target = load_target_at(str(target_dir), "int8")

    def kernels(drafter: object) -> set[str]:
        assert isinstance(drafter, ModelDrafter)
        return {type(m).__name__ for m in drafter.model.net.modules()}  # type: ignore[attr-defined]

    assert "Int8Linear" in kernels(load_drafter_at(str(draft_dir), target, "int8"))
    hybrid = load_drafter(f"suffix:none+{draft_dir}", target, quantize="int8")
    assert isinstance(hybrid, HybridDrafter)
    assert "Int8Linear" in kernels(hybrid.model) and "Linear" not in kernels(hybrid.model)
    assert "Linear" in kernels(load_drafter_at(str(draft_dir), target, "fp32"))
