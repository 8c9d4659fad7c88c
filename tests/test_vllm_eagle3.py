"""The EAGLE-3 layout of spectune's feature head and its export as vLLM's EAGLE-3 folder
(``spectune.engines.vllm.eagle3``): config keys, weight names and shapes, the draft
vocabulary's maps, and that the exported weights, run the way vLLM's ``llama_eagle3``
runs them, compute the head's own drafts. vLLM itself serves the folder in
tests/test_vllm_live.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.distill.data import DistillCorpus, GenerationSettings, corpus_from_token_ids
from spectune.distill.models import DraftArchitecture
from spectune.distill.pipeline import distill
from spectune.distill.train import Budget, TrainSettings
from spectune.drafters.loading import feature_drafter_from_folder, load_feature_head
from spectune.engines.vllm.eagle3 import (
    export_eagle3,
    read_head,
    vllm_default_layers,
)
from spectune.models.feature_head import FeatureHead, FeatureHeadConfig
from spectune.models.llama import LlamaLM, apply_rotary, rotary_tables
from spectune.models.loading import save_native
from spectune.models.toy import toy_config, toy_model
from spectune.sampling import SamplingParams

TAPS = (0, 1, 2)  # of the toy target's four blocks: all but the last


@pytest.fixture(scope="module")
def target() -> LlamaLM:
    return toy_model(3, config=toy_config(num_layers=4), scale=3.0)


@pytest.fixture(scope="module")
def head_folder(target: LlamaLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An EAGLE-3-layout head distilled briefly on the toy target, 40 draft tokens."""
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (6,), generator=generator).tolist() for _ in range(48)]
    target.expose_layers(TAPS)  # the corpus holds the states the head reads
    try:
        corpus = corpus_from_token_ids(
            target, prompts, GenerationSettings(max_new_tokens=24, batch_size=24, top_k=16)
        )
    finally:
        target.expose_layers(())
    arch = DraftArchitecture(
        kind="feature", intermediate_size=64, feature_layers=TAPS, layout="eagle3", unroll=2
    )
    result = distill(
        target,
        (corpus, DistillCorpus([])),
        arch,
        tmp_path_factory.mktemp("eagle3-head"),
        vocab_size=40,
        settings=TrainSettings(learning_rate=3e-3, warmup_steps=10, batch_tokens=512),
        budget=Budget(max_steps=60),
        heldout_sequences=8,
        training_record={"command": "tests/test_vllm_eagle3.py"},
    )
    return result.folder


@pytest.fixture(scope="module")
def target_folder(target: LlamaLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("target")
    save_native(target, folder)
    return folder


@pytest.fixture(scope="module")
def exported(head_folder: Path, target_folder: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("vllm-head") / "head"
    done = export_eagle3(head_folder, target_folder, out, k=2)
    return done, json.loads((out / "config.json").read_text()), load_file(out / "model.safetensors")


def test_vllm_default_layers_in_spectune_numbering() -> None:
    # vLLM's (2, 15, 27) for SmolLM2's 30 blocks are the outputs of blocks 1, 14, 26.
    assert vllm_default_layers(30) == (1, 14, 26)
    assert vllm_default_layers(32) == (1, 15, 28)


def test_config_states_every_convention(exported) -> None:  # type: ignore[no-untyped-def]
    done, config, _ = exported
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # TAPS + 1
    assert done.aux_layer_ids == (1, 2, 3)
    assert (config["norm_before_residual"], config["fc_norm"], config["norm_output"]) == (
        True,
        True,
        True,
    )
    assert config["norm_before_fc"] is False
    assert config["draft_vocab_size"] == done.draft_vocab_size == 40
    assert config["target_hidden_size"] == 32
    layer = config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["vocab_size"]) == (
        "llama",
        1,
        64,
    )
    assert (layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]) == (
        4,
        2,
        8,
    )
    spec = config["speculators_config"]
    assert spec["proposal_methods"][0]["speculative_tokens"] == 2
    assert Path(spec["verifier"]["name_or_path"]).is_dir()
    assert done.speculative_config(3) == {
        "method": "eagle3",
        "model": str(done.folder),
        "num_speculative_tokens": 3,
    }


def test_weight_names_shapes_and_vocabulary_maps(
    exported, head_folder: Path, target: LlamaLM
) -> None:  # type: ignore[no-untyped-def]
    _, _, weights = exported
    hidden, q_out, kv_out = 32, 32, 16
    expected = {
        "fc.weight": (hidden, 3 * hidden),
        "fc_norm.0.weight": (hidden,),
        "fc_norm.1.weight": (hidden,),
        "fc_norm.2.weight": (hidden,),
        "layers.0.input_layernorm.weight": (hidden,),
        "layers.0.hidden_norm.weight": (hidden,),
        "layers.0.self_attn.q_proj.weight": (q_out, 2 * hidden),
        "layers.0.self_attn.k_proj.weight": (kv_out, 2 * hidden),
        "layers.0.self_attn.v_proj.weight": (kv_out, 2 * hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, q_out),
        "layers.0.post_attention_layernorm.weight": (hidden,),
        "layers.0.mlp.gate_proj.weight": (64, hidden),
        "layers.0.mlp.up_proj.weight": (64, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, 64),
        "norm.weight": (hidden,),
        "lm_head.weight": (40, hidden),
        "d2t": (40,),
        "t2d": (64,),
    }
    assert {k: tuple(v.shape) for k, v in weights.items()} == expected
    head = read_head(head_folder)
    subset = head.vocab_subset
    assert subset is not None
    # d2t holds target id - draft id; t2d marks the draft vocabulary's target ids.
    assert weights["d2t"].dtype == torch.int64
    assert torch.equal(torch.arange(40) + weights["d2t"], subset)
    assert weights["t2d"].dtype == torch.bool and int(weights["t2d"].sum()) == 40
    assert weights["t2d"][subset].all()
    assert torch.equal(weights["lm_head.weight"], target.net.lm_head.weight[subset])
    assert torch.equal(weights["fc.weight"], head.state["fuse.weight"])
    assert all(torch.equal(weights[f"fc_norm.{i}.weight"], torch.ones(hidden)) for i in range(3))
    for name, value in head.state.items():
        if name.startswith("layer."):
            assert torch.equal(weights["layers.0." + name.removeprefix("layer.")], value)
    assert "embed_tokens.weight" not in weights  # vLLM shares the target's


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _vllm_eagle3_step(
    w: dict[str, Tensor],
    cfg: dict,  # type: ignore[type-arg]
    embeds: Tensor,  # [n, hidden] the tokens' embeddings
    states: Tensor,  # [n, hidden] already combined (fc), or fed back
) -> tuple[Tensor, Tensor]:
    """vLLM's ``llama_eagle3.LlamaModel.forward`` for one sequence, written from its source
    (one layer, ``norm_before_residual``, causal attention): (normed, fed back)."""
    layer = cfg["transformer_layer_config"]
    eps, heads, kv_heads, dim = (
        layer["rms_norm_eps"],
        layer["num_attention_heads"],
        layer["num_key_value_heads"],
        layer["head_dim"],
    )
    p = "layers.0."
    hidden = _rms(states, w[p + "hidden_norm.weight"], eps)
    residual = hidden
    x = torch.cat((_rms(embeds, w[p + "input_layernorm.weight"], eps), hidden), -1)
    n = x.shape[0]
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(1, n, heads, dim)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(1, n, kv_heads, dim)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(1, n, kv_heads, dim)
    cos, sin = rotary_tables(torch.arange(n)[None], dim, layer["rope_theta"])
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    x = residual + out.transpose(1, 2).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
    h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
    gate = h @ w[p + "mlp.gate_proj.weight"].T
    x = x + (F.silu(gate) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    normed = _rms(x, w["norm.weight"], eps)
    return normed, (normed if cfg["norm_output"] else x)


def _vllm_combine(w: dict[str, Tensor], cfg: dict, aux: Tensor) -> Tensor:  # type: ignore[type-arg]
    """vLLM's ``combine_hidden_states``: fc_norm per aux state, then fc."""
    eps = cfg["transformer_layer_config"]["rms_norm_eps"]
    chunks = aux.chunk(len(cfg["eagle_aux_hidden_state_layer_ids"]), -1)
    normed = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(chunks)], -1)
    return normed @ w["fc.weight"].T


def _vllm_logits(w: dict[str, Tensor], features: Tensor, vocab: int) -> Tensor:
    """vLLM's ``compute_logits``: draft logits scattered to target ids, -inf elsewhere."""
    draft = features @ w["lm_head.weight"].T
    full = torch.full((features.shape[0], vocab), float("-inf"))
    full[:, torch.arange(draft.shape[1]) + w["d2t"]] = draft
    return full


def test_exported_weights_draft_as_the_head_does(
    exported, head_folder: Path, target: LlamaLM
) -> None:  # type: ignore[no-untyped-def]
    """Run as vLLM runs them, the exported weights give the head's own features and draft
    tokens, for the first draft token (target states) and a second (the head's own)."""
    _, config, weights = exported
    head, subset = load_feature_head(head_folder, target.net)  # fp32, as vLLM runs it
    assert subset is not None
    tokens = torch.tensor([[5, 9, 17, 33, 4, 21, 8]])
    _, states = target.net(tokens, torch.arange(7)[None], capture=TAPS)  # [1, 7, 3 * 32]
    head_in = head.target_input(states[:, :-1])  # h[t - 1]
    features = head(tokens[:, 1:], head_in)[0]  # [6, hidden]
    embeds = target.net.embed_tokens.weight[tokens[0, 1:]]
    fc = _vllm_combine(weights, config, states[0, :-1])
    normed, fed = _vllm_eagle3_step(weights, config, embeds, fc)
    torch.testing.assert_close(normed, features, atol=1e-5, rtol=1e-4)
    ours = subset[head.logits(features).argmax(-1)]
    theirs = _vllm_logits(weights, normed, 64).argmax(-1)
    assert torch.equal(ours, theirs)
    # A second draft token: slot i reads what slot i - 1 fed back (spectune: f).
    second = head(tokens[:, 2:], features[None, :-1])[0]
    normed2, _ = _vllm_eagle3_step(weights, config, embeds[1:], fed[:-1])
    torch.testing.assert_close(normed2, second, atol=1e-5, rtol=1e-4)


def test_eagle3_layout_speculation_keeps_greedy_output(head_folder: Path, target: LlamaLM) -> None:
    params = SamplingParams(max_tokens=24)
    prompt = [5, 9, 17, 33]
    plain = SpeculativeEngine(target).run(prompt, params, policy=FixedK(0)).tokens
    try:
        drafter = feature_drafter_from_folder(head_folder, target)
        run = SpeculativeEngine(target, drafter).run(prompt, params, policy=FixedK(3))
    finally:
        target.expose_layers(())
    assert run.tokens == plain
    assert run.counts.accepted > 0  # the distilled head agrees with the toy target at times


def test_eagle3_layout_needs_layers() -> None:
    with pytest.raises(ValueError, match="several target layers"):
        FeatureHeadConfig(8, 16, 2, 1, 4, 32, layout="eagle3")
    with pytest.raises(ValueError, match="unknown head layout"):
        FeatureHeadConfig(8, 16, 2, 1, 4, 32, feature_layers=(0,), layout="eagle2")


def test_eagle3_head_cache_equals_full_pass() -> None:
    cfg = FeatureHeadConfig(16, 32, 4, 2, 4, 50, feature_layers=(0, 2), layout="eagle3")
    head = FeatureHead(cfg, torch.randn(50, 16), torch.randn(10, 16))
    tokens, prev = torch.randint(0, 50, (1, 7)), torch.randn(1, 7, 16)
    cache = head.new_cache(16)
    chunked = torch.cat(
        (head(tokens[:, :4], prev[:, :4], cache), head(tokens[:, 4:], prev[:, 4:], cache)), 1
    )
    torch.testing.assert_close(chunked, head(tokens, prev), atol=1e-5, rtol=1e-4)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectune", "convert", *args], capture_output=True, text=True
    )


def test_cli_writes_the_folder(head_folder: Path, target_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "head"
    done = _cli(
        "--draft", str(head_folder), "--target", str(target_folder), "--out", str(out), "--k", "4"
    )
    assert done.returncode == 0, done.stderr
    assert '"num_speculative_tokens": 4' in done.stdout
    assert json.loads((out / "config.json").read_text())["speculators_model_type"] == "eagle3"
    again = _cli("--draft", str(head_folder), "--target", str(target_folder), "--out", str(out))
    assert again.returncode == 0, again.stderr  # its own folder may be written again


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--draft", "smollm2-draft"], "--draft needs --target"),
        (["--draft", "smollm2-draft", "--target", "TARGET"], "spectune's own head layout"),
        (["--draft", "nowhere", "--target", "TARGET"], "not a feature-head draft folder"),
        (["--draft", "HEAD", "--target", "/nonexistent"], "not a Hugging Face folder"),
        (["--draft", "HEAD", "--target", "TARGET", "--k", "0"], "--k must be >= 1"),
        (["--draft", "HEAD", "--target", "TARGET", "--out", "FILE"], "is a file"),
    ],
)
def test_cli_refuses_in_one_line(
    args: list[str], message: str, head_folder: Path, target_folder: Path, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("x")
    names = {"HEAD": str(head_folder), "TARGET": str(target_folder), "FILE": str(tmp_path / "file")}
    args = [names.get(a, a) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    done = _cli(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("spectune: error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()
