"""spectune's feature head as vLLM's EAGLE-3 draft: a ``speculators``-format folder that
vLLM 0.32 serves with ``--speculative-config '{"method": "eagle3", "model": FOLDER,
"num_speculative_tokens": K}'``.

What vLLM runs (``vllm/model_executor/models/llama_eagle3.py``; the folder's config is read
by ``vllm/transformers_utils/configs/speculators``), against spectune's head
(``spectune.models.feature_head``):

- **Layer taps.** vLLM's aux hidden state ``L`` is the target's residual stream entering
  block ``L`` (0 = the embeddings, ``n`` = the last block's output before the final norm);
  spectune's feature layer ``i`` is the output of block ``i``, so it is vLLM's ``i + 1``,
  except the last block, which spectune takes after the final norm and vLLM cannot give.
  vLLM's default for a Llama is (2, n // 2, n - 3) (``vllm_default_layers``); the folder
  names its own (``eagle_aux_hidden_state_layer_ids``), so vLLM reads the head's.
- **Fusion.** vLLM: ``fc`` over the concatenated aux states, optionally after one RMSNorm
  per state (``fc_norm``). spectune scales each state to unit RMS before ``fuse``: that is
  ``fc_norm`` with unit weights, written as such; ``fuse`` is vLLM's ``fc``.
- **The layer.** vLLM's attention reads ``concat(input_layernorm(embedding),
  hidden_norm(h))`` (2 x hidden wide); with ``norm_before_residual`` (what vLLM assumes
  when a speculators config omits it; ``speculators`` itself defaults to false) the
  residual stream starts from ``hidden_norm(h)``. spectune's default layout instead
  projects ``fc(concat(embedding, h))`` and runs a plain Llama layer on it: no weights
  reproduce vLLM's two separate norms from a norm of their projection, so only a head of
  the EAGLE-3 layout (``spectune distill --layout eagle3``, ``Eagle3Layer``) exports.
- **What is fed back.** Drafting a second token, vLLM feeds the layer's pre-norm output
  back as h unless ``norm_output`` is set; spectune feeds the normed output ``f``, so the
  folder sets ``norm_output: true``.
- **Vocabulary.** spectune's head scores a subset of the target's tokens with the
  target's own output rows (frozen). vLLM's head has its own ``lm_head`` over
  ``draft_vocab_size`` rows and ``d2t`` (draft id -> target id minus draft id, int64);
  ``t2d`` (a bool per target token) is written as ``speculators`` writes it, and vLLM
  skips it. A head over the full vocabulary writes neither.
- **Embedding.** Both use the target's: the folder holds no ``embed_tokens``, so vLLM
  shares the target's (``_maybe_share_embeddings``).

Weights, under speculators' names (vLLM maps ``layers.0.`` and stacks q/k/v and gate/up):
``fc.weight`` [hidden, taps * hidden], ``fc_norm.{i}.weight`` [hidden],
``layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`` [hidden],
``layers.0.self_attn.{q,k,v}_proj.weight`` [out, 2 * hidden], ``o_proj`` [hidden, q out],
``layers.0.mlp.{gate,up,down}_proj.weight``, ``norm.weight``, ``lm_head.weight``
[draft vocab, hidden], ``d2t`` [draft vocab], ``t2d`` [target vocab]; all fp32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from spectune.drafters.loading import read_draft_meta
from spectune.errors import InvalidParameterError, ModelLoadError
from spectune.models.feature_head import FeatureHeadConfig
from spectune.models.shipped import shipped_draft_path

__all__ = [
    "Eagle3Export",
    "HeadSource",
    "TargetFolder",
    "aux_layer_ids",
    "eagle3_config",
    "eagle3_weights",
    "export_eagle3",
    "read_head",
    "read_target_folder",
    "refusal",
    "vllm_default_layers",
]

VLLM_METHOD = "eagle3"
FILES = ("config.json", "model.safetensors")


def vllm_default_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default EAGLE-3 taps for a Llama of ``num_layers`` blocks, (2, n // 2, n - 3)
    in its numbering (the residual stream entering that block), in spectune's (the output
    of block i, so one less)."""
    return tuple(i - 1 for i in (2, num_layers // 2, num_layers - 3))


def aux_layer_ids(feature_layers: tuple[int, ...]) -> list[int]:
    """spectune's feature layers (outputs of blocks i) as vLLM's aux hidden-state ids."""
    return [i + 1 for i in feature_layers]


@dataclass(frozen=True)
class HeadSource:
    """A feature-draft folder as read from disk."""

    path: Path
    cfg: FeatureHeadConfig
    state: dict[str, Tensor]  # the head's own weights (fp32), ``vocab_subset`` taken out
    vocab_subset: Tensor | None  # [num_draft_tokens] int64 target ids, or None: all


@dataclass(frozen=True)
class TargetFolder:
    """The Hugging Face folder vLLM serves as the target (``spectune convert`` writes one)."""

    path: Path
    num_layers: int
    hidden_size: int
    vocab_size: int
    output_name: str  # the tensor holding the output rows (the embedding when tied)


@dataclass(frozen=True)
class Eagle3Export:
    folder: Path
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]  # vLLM's numbering

    def speculative_config(self, k: int) -> dict[str, Any]:
        """vLLM's ``--speculative-config`` for this head at ``k`` draft tokens."""
        return {"method": VLLM_METHOD, "model": str(self.folder), "num_speculative_tokens": k}


def read_head(spec: str | Path) -> HeadSource:
    """A feature-draft folder (or a shipped draft's name): its config and weights."""
    from safetensors.torch import load_file

    path = Path(spec)
    if not path.exists():
        path = shipped_draft_path(str(spec)) or path
    meta = read_draft_meta(path) if path.is_dir() else None
    if meta is None or meta.kind != "feature":
        raise InvalidParameterError(f"--draft {spec} is not a feature-head draft folder")
    cfg = FeatureHeadConfig.from_dict(meta.data["head"])
    try:
        state = load_file(str(path / "model.safetensors"))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path / 'model.safetensors'}: {exc}") from exc
    subset = state.pop("vocab_subset", None)
    return HeadSource(
        path.resolve(),
        cfg,
        {k: v.float() for k, v in state.items()},
        None if subset is None else subset.long(),
    )


def read_target_folder(path: Path) -> TargetFolder:
    """The target's shape and where its output rows are, from its Hugging Face folder."""
    config_file = path / "config.json"
    weights = path / "model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        raise InvalidParameterError(
            f"--target {path} is not a Hugging Face folder with model.safetensors: write one "
            f"with 'spectune convert --out {path}'"
        )
    config = json.loads(config_file.read_text())
    tied = bool(config.get("tie_word_embeddings", False))
    return TargetFolder(
        path.resolve(),
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        vocab_size=int(config["vocab_size"]),
        output_name="model.embed_tokens.weight" if tied else "lm_head.weight",
    )


def refusal(head: HeadSource, target: TargetFolder) -> str | None:
    """Why vLLM's EAGLE-3 cannot run this head on this target, or None."""
    cfg, name = head.cfg, head.path.name
    last_tap = bool(cfg.feature_layers) and cfg.feature_layers[-1] >= target.num_layers - 1
    if cfg.layout != "eagle3":
        also = (
            f", and it reads layer {cfg.feature_layers[-1]} after the final norm"
            if last_tap
            else ""
        )
        return (
            f"{name} has spectune's own head layout (fc over embedding and state, then a Llama "
            "layer), which no weights map onto vLLM's EAGLE-3 layer (separate norms on "
            f"embedding and state, attention over both){also}: train one with "
            "'spectune distill --kind feature --layout eagle3'"
        )
    if (cfg.hidden_size, cfg.target_vocab_size) != (target.hidden_size, target.vocab_size):
        return (
            f"{name} was trained for hidden size {cfg.hidden_size} / vocabulary "
            f"{cfg.target_vocab_size}; {target.path} has {target.hidden_size} / "
            f"{target.vocab_size}"
        )
    if last_tap:
        return (
            f"{name} reads target layer {cfg.feature_layers[-1]} of {target.num_layers}: the "
            "last block's state is taken after the final norm, which vLLM does not expose"
        )
    return None


def eagle3_weights(head: HeadSource, output_rows: Tensor) -> dict[str, Tensor]:
    """The head's weights under speculators' names. ``output_rows``: [target vocab, hidden]
    the target's output layer, of which the draft vocabulary's rows become ``lm_head``."""
    cfg = head.cfg
    taps = len(cfg.feature_layers)
    weights: dict[str, Tensor] = {"fc.weight": head.state["fuse.weight"]}
    for i in range(taps):  # spectune's per-state unit-RMS scaling: fc_norm, unit weights
        weights[f"fc_norm.{i}.weight"] = torch.ones(cfg.hidden_size)
    for name, value in head.state.items():
        if name.startswith("layer."):
            weights["layers.0." + name.removeprefix("layer.")] = value
    weights["norm.weight"] = head.state["norm.weight"]
    subset = head.vocab_subset
    if subset is None:
        weights["lm_head.weight"] = output_rows.float()
    else:
        weights["lm_head.weight"] = output_rows[subset].float()
        weights["d2t"] = subset - torch.arange(len(subset))  # target id - draft id
        t2d = torch.zeros(cfg.target_vocab_size, dtype=torch.bool)
        t2d[subset] = True
        weights["t2d"] = t2d
    return {k: v.contiguous() for k, v in weights.items()}


def eagle3_config(head: HeadSource, target: TargetFolder, k: int) -> dict[str, Any]:
    """The speculators-format ``config.json`` (``speculators_model_type: eagle3``)."""
    cfg = head.cfg
    draft_vocab = cfg.target_vocab_size if head.vocab_subset is None else len(head.vocab_subset)
    layer = {
        "model_type": "llama",
        "vocab_size": cfg.target_vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_context,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": target.hidden_size,
        # Every convention below is written out: vLLM's and speculators' defaults differ.
        "norm_before_residual": True,
        "norm_before_fc": False,
        "fc_norm": True,
        "norm_output": True,
        "eagle_aux_hidden_state_layer_ids": aux_layer_ids(cfg.feature_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "verifier": {"name_or_path": str(target.path), "architectures": ["LlamaForCausalLM"]},
        },
        "torch_dtype": "float32",
    }


def check_out(out: Path) -> None:
    """``out`` may be written: absent, empty, or a folder this exporter wrote before."""
    if out.exists() and not out.is_dir():
        raise InvalidParameterError(f"--out {out} is a file; the head needs a folder")
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir() if p.name not in FILES)
        if others:
            raise InvalidParameterError(
                f"--out {out} holds other files ({', '.join(others[:3])}): give a new folder"
            )


def export_eagle3(draft: str | Path, target: Path, out: Path, k: int = 3) -> Eagle3Export:
    """Write ``draft`` (a feature-head folder or shipped name) as vLLM's EAGLE-3 folder
    ``out`` for the target vLLM serves from ``target`` (its Hugging Face folder); ``k``
    is the folder's default number of draft tokens. Refused in one line before anything
    is written when the head cannot be served (``refusal``)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if k < 1:
        raise InvalidParameterError(f"--k must be >= 1, got {k}")
    check_out(out)
    head = read_head(draft)
    folder = read_target_folder(target)
    reason = refusal(head, folder)
    if reason is not None:
        raise InvalidParameterError(reason)
    with safe_open(str(folder.path / "model.safetensors"), framework="pt") as f:
        if folder.output_name not in f.keys():
            raise ModelLoadError(f"{folder.path}: no {folder.output_name} in model.safetensors")
        output_rows = f.get_tensor(folder.output_name)  # [target vocab, hidden]
    weights = eagle3_weights(head, output_rows)
    config = eagle3_config(head, folder, k)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return Eagle3Export(
        out.resolve(),
        int(config["draft_vocab_size"]),
        tuple(aux_layer_ids(head.cfg.feature_layers)),
    )
