"""Draft folders written by ``spectune distill`` and how they become drafters.

A distilled draft folder holds ``spectune_draft.json`` next to its weights:

- ``{"kind": "lm", ...}``: an HF-layout Llama folder (``config.json`` +
  ``model.safetensors``, loadable by transformers as is) plus ``vocab_subset.safetensors``
  when the draft was trained on a reduced vocabulary. spectune then keeps only those
  output rows, so the draft's LM head costs N / vocab of the full one.
- ``{"kind": "gpt2", ...}``: transformers' own GPT-2 folder (full vocabulary), loaded like
  any transformers model (the native runtime is Llama-family only).
- ``{"kind": "feature", ...}``: an EAGLE-style head (``spectune.models.feature_head``);
  it borrows the target's embedding and output rows, so it can only be built against the
  target it was trained for (checked by shape and a weight fingerprint).

Folders without ``spectune_draft.json`` are plain draft models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.model import ModelDrafter
from spectune.errors import IncompatibleModelsError, ModelLoadError
from spectune.models.base import LanguageModel
from spectune.models.feature_head import FeatureHead, FeatureHeadConfig
from spectune.models.llama import LlamaLM, LlamaTransformer
from spectune.models.llamacpp import refuse_feature_head
from spectune.models.quant import QuantMode

__all__ = [
    "DRAFT_META_FILE",
    "DraftMeta",
    "feature_drafter_from_folder",
    "head_kernels",
    "load_feature_head",
    "not_distilled_for",
    "read_draft_meta",
    "restrict_output",
    "target_fingerprint",
]

DRAFT_META_FILE = "spectune_draft.json"


@dataclass(frozen=True)
class DraftMeta:
    kind: str  # "lm" | "gpt2" | "feature"
    data: dict[str, Any]  # the whole file: training command, target description, ...


def read_draft_meta(path: Path) -> DraftMeta | None:
    file = path / DRAFT_META_FILE
    if path.is_file() or not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {file}: {exc}") from exc
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in ("lm", "gpt2", "feature"):
        raise ModelLoadError(f"{file}: 'kind' must be 'lm', 'gpt2' or 'feature', got {kind!r}")
    return DraftMeta(str(kind), data)


def target_fingerprint(target: LlamaTransformer) -> float:
    """Mean norm of the first 256 embedding rows: tells checkpoints of different models
    apart while tolerating quantisation (a GGUF and its f16 original agree to ~1%)."""
    rows = target.embed_tokens.weight.detach()[:256].float().to("cpu")
    return float(rows.norm(dim=-1).mean())


def _other_target(described: dict[str, Any], target: LlamaTransformer) -> str | None:
    """Why the weights of ``target`` are not those a draft's folder describes (or None)."""
    expected = described.get("fingerprint")
    if isinstance(expected, float) and abs(target_fingerprint(target) - expected) > 0.05 * expected:
        return f"trained for a different target ({described.get('name', '?')})"
    return None


def not_distilled_for(meta: DraftMeta, target: LanguageModel) -> str | None:
    """Why the distilled draft of ``meta`` was not trained on ``target``'s token ids, or None
    when its record agrees (vocabulary size, and the weight fingerprint on the native
    runtime)."""
    described = meta.data.get("target")
    if not isinstance(described, dict):
        return "its spectune_draft.json does not name the target it was distilled for"
    if described.get("vocab_size") != target.info.vocab_size:
        return (
            f"it was distilled for a vocabulary of {described.get('vocab_size')}, "
            f"not {target.info.vocab_size}"
        )
    return _other_target(described, target.net) if isinstance(target, LlamaLM) else None


def _subset(path: Path) -> Tensor | None:
    file = path / "vocab_subset.safetensors"
    if not file.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(file))["vocab_subset"].long()


def restrict_output(model: LlamaLM, vocab_subset: Tensor) -> None:
    """Keep only the subset's rows of the output layer (in place: logits become
    [..., num_draft_tokens]; ``model.info`` keeps describing the full vocabulary)."""
    net = model.net
    weight = net.lm_head.weight.detach()[vocab_subset].clone()  # [num_draft_tokens, hidden]
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.weight = nn.Parameter(weight, requires_grad=False)
    net.lm_head = head


def lm_drafter_from_folder(path: Path, model: LanguageModel) -> ModelDrafter:
    subset = _subset(path)
    if subset is not None:
        if not isinstance(model, LlamaLM):
            raise ModelLoadError(f"{path}: a reduced-vocabulary draft needs the native runtime")
        restrict_output(model, subset)
    return ModelDrafter(model, name=f"model:{path.name}", vocab_subset=subset)


def feature_drafter_from_folder(path: Path, target: LanguageModel) -> FeatureDrafter:
    refuse_feature_head(target)
    if not isinstance(target, LlamaLM):
        raise IncompatibleModelsError(
            "a feature-head draft reads the target's weights: the target must run natively"
        )
    head, subset = load_feature_head(path, target.net)
    head = head.to(target.dtype)
    head.quantize(head_kernels(target.precision))
    if head.cfg.feature_layers:
        try:
            target.expose_layers(head.cfg.feature_layers)  # the head reads these target layers
        except ValueError as exc:
            raise IncompatibleModelsError(f"feature draft {path.name}: {exc}") from exc
    return FeatureDrafter(head, subset, name=f"feature:{path.name}")


def head_kernels(target_precision: str) -> QuantMode:
    """The weight-only kernels a feature head runs on beside a target of this precision:
    int4 beside an int4 target, else int8 (fp32, bf16 and int8 targets). The head is read in
    full for every draft token, so its bytes are its cost (c): int8 reads a quarter of
    fp32's and leaves its drafts nearly unchanged (docs/results/head-kernels: teacher-forced
    first-token acceptance 0.314 fp32, 0.311 int8, 0.312 int4; a step of the head of 2026-12-04
    1.15 ms fp32, 0.72 int8, 0.62 int4 against 27 ms for the fp32 target, two threads).
    Verification is exact whatever the head's weights, so this changes no output."""
    return "int4" if target_precision == "int4" else "int8"


def load_feature_head(path: Path, net: LlamaTransformer) -> tuple[FeatureHead, Tensor | None]:
    """The fp32 head of a feature-draft folder wired to ``net`` (its embedding and output
    rows, on the CPU), and its reduced vocabulary; refused for another target."""
    from safetensors.torch import load_file

    meta = read_draft_meta(path)
    if meta is None or meta.kind != "feature":
        raise ModelLoadError(f"{path} is not a feature-head draft folder")
    cfg = FeatureHeadConfig.from_dict(meta.data["head"])
    described = meta.data.get("target", {})
    problems = []
    if cfg.hidden_size != net.cfg.hidden_size or cfg.target_vocab_size != net.cfg.vocab_size:
        problems.append(
            f"trained for hidden size {cfg.hidden_size} / vocabulary {cfg.target_vocab_size}, "
            f"the target has {net.cfg.hidden_size} / {net.cfg.vocab_size}"
        )
    other = _other_target(described, net)
    if other is not None:
        problems.append(other)
    if problems:
        raise IncompatibleModelsError(f"feature draft {path.name}: " + "; ".join(problems))
    try:
        state = load_file(str(path / "model.safetensors"))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path / 'model.safetensors'}: {exc}") from exc
    subset = state.pop("vocab_subset", None)
    subset = None if subset is None else subset.long()
    # The head runs on the CPU beside the decode loop (``spectune.models.devices``).
    output = net.lm_head.weight.detach().to("cpu")
    head = FeatureHead(
        cfg,
        net.embed_tokens.weight.detach().to("cpu"),
        output if subset is None else output[subset].clone(),
    )
    missing, unexpected = head.load_state_dict({k: v.float() for k, v in state.items()}, False)
    if missing or unexpected:
        raise ModelLoadError(f"{path}: weights do not match the head ({missing or unexpected})")
    return head, subset


def describe_target(target: LlamaTransformer, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "hidden_size": target.cfg.hidden_size,
        "vocab_size": target.cfg.vocab_size,
        "num_layers": target.cfg.num_layers,
        "num_parameters": sum(p.numel() for p in target.parameters()),
        "fingerprint": target_fingerprint(target),
    }


def subset_tensor_file(path: Path, vocab_subset: Tensor) -> None:
    from safetensors.torch import save_file

    save_file({"vocab_subset": vocab_subset.to(torch.int64).contiguous()}, str(path))
