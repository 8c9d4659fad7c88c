"""Write trained drafts as folders the engine (and, for LM drafts, transformers) loads.

Layout and loading rules: ``spectune.drafters.loading``. Every folder also records the
command that trained it and its learning curve in ``spectune_draft.json``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from spectune.distill.models import FeatureDraftModel, GPT2DraftModel, LMDraftModel
from spectune.drafters.loading import DRAFT_META_FILE, describe_target, subset_tensor_file
from spectune.models.llama import LlamaLM, LlamaTransformer
from spectune.models.loading import save_native

__all__ = ["save_feature_draft", "save_gpt2_draft", "save_lm_draft"]


def _write_meta(folder: Path, meta: dict[str, Any]) -> None:
    (folder / DRAFT_META_FILE).write_text(json.dumps(meta, indent=2))


def save_feature_draft(
    folder: Path,
    draft: FeatureDraftModel,
    target: LlamaTransformer,
    target_name: str,
    training: dict[str, Any],
) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous() for k, v in draft.head.state_dict().items()}
    if draft.vocab_subset is not None:
        state["vocab_subset"] = draft.vocab_subset.to(torch.int64).contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    head_cfg = draft.head.cfg.to_dict()
    # config.json marks the folder as a draft (shipped-draft lookup keys on it); it is not
    # a transformers config: the head cannot run without its target.
    (folder / "config.json").write_text(
        json.dumps({"model_type": "spectune-feature-head", **head_cfg}, indent=2)
    )
    _write_meta(
        folder,
        {
            "kind": "feature",
            "head": head_cfg,
            "trainable_parameters": draft.head.trainable_parameters(),
            "vocab_subset_size": None if draft.vocab_subset is None else len(draft.vocab_subset),
            "target": describe_target(target, target_name),
            "training": training,
        },
    )


def save_lm_draft(
    folder: Path,
    draft: LMDraftModel,
    target: LlamaTransformer,
    target_name: str,
    training: dict[str, Any],
) -> None:
    """HF Llama layout in fp16 (half the bytes; loaders upcast), plus the subset ids."""
    net = copy.deepcopy(draft.net).to(torch.float16)
    save_native(LlamaLM(net), folder, extra_config={"torch_dtype": "float16"})
    if draft.vocab_subset is not None:
        subset_tensor_file(folder / "vocab_subset.safetensors", draft.vocab_subset)
    _write_meta(
        folder,
        {
            "kind": "lm",
            "vocab_subset_size": None if draft.vocab_subset is None else len(draft.vocab_subset),
            "target": describe_target(target, target_name),
            "training": training,
        },
    )


def save_gpt2_draft(
    folder: Path,
    draft: GPT2DraftModel,
    target: LlamaTransformer,
    target_name: str,
    training: dict[str, Any],
) -> None:
    """transformers' own GPT-2 folder (``save_pretrained``, safetensors, fp32): spectune
    loads it with ``--runtime hf`` like any transformers model."""
    folder.mkdir(parents=True, exist_ok=True)
    draft.model.save_pretrained(str(folder))
    _write_meta(
        folder,
        {
            "kind": "gpt2",
            "vocab_subset_size": None,
            "target": describe_target(target, target_name),
            "training": training,
        },
    )
