"""Adapter: any transformers ``AutoModelForCausalLM`` as a spectune ``LanguageModel``.

Rollback goes through ``DynamicCache.crop``. Ragged batches are a native-runtime feature:
this adapter decodes one sequence per cache.

Token trees: transformers passes a ready 4-D attention mask straight to the attention
kernel (``masking_utils``: "already prepared, or custom"), so a tree's ancestor mask goes in
as an additive float mask over [prefix, chunk] with the tree's depth positions as
``position_ids``, and the accepted path is compacted by copying its keys and values down
(``move_slots``). That holds for models whose every layer attends to the full context with
the eager or SDPA kernels (``tree_masks``); sliding-window layers (Gemma 3, Mistral) would
lose their window under a custom mask, so such models say they cannot take trees.

A GGUF file is de-quantised by transformers (about 2 minutes and 3 GB for Gemma 3 270M on
two cores); the result is kept in spectune's cache as an HF folder of fp32 safetensors
(``spectune.models.cache_dir``, kind ``gguf-hf``), which later starts load instead.
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from spectune.errors import ModelLoadError, PromptError
from spectune.models.base import ModelInfo, ModelOutput
from spectune.models.cache_dir import derived_path
from spectune.models.weights import check_weights

__all__ = ["HFCache", "HFModel", "converted_gguf_path", "load_hf_model"]


class HFCache:
    """One sequence's transformers cache plus its length."""

    def __init__(self, capacity: int) -> None:
        from transformers import DynamicCache

        self.inner: Any = DynamicCache()
        self._length = 0
        self._capacity = capacity

    @property
    def batch_size(self) -> int:
        return 1

    @property
    def capacity(self) -> int:
        return self._capacity

    def length(self, row: int = 0) -> int:
        return self._length

    def truncate(self, length: int, row: int = 0) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot truncate a cache of length {self._length} to {length}")
        if length < self._length:
            # A negative argument removes that many tokens (every transformers version).
            self.inner.crop(length - self._length)
        self._length = length

    @torch.inference_mode()  # the tensors were made in inference mode by ``forward``
    def move_slots(self, row: int, src: Tensor, dst_start: int) -> None:
        """Copy the entries at positions ``src`` [n] to ``dst_start..dst_start+n-1`` (tree
        compaction; ``src`` ascends and never lies below its destination)."""
        dst = torch.arange(dst_start, dst_start + src.shape[0])
        for layer in self.inner.layers:
            layer.keys[:, :, dst] = layer.keys[:, :, src]  # [1, kv_heads, length, head_dim]
            layer.values[:, :, dst] = layer.values[:, :, src]


class HFModel:
    def __init__(self, model: Any, name: str) -> None:
        self.model = model.eval()
        # transformers renamed ``past_key_values`` to ``cache`` (5.x); use whichever it takes.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # Causal LMs of recent transformers compute the head for the last N positions only.
        self._keeps_logits = "logits_to_keep" in params
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        eos = (
            cfg.eos_token_id
            if cfg.eos_token_id is not None
            else getattr(model.generation_config, "eos_token_id", None)
        )
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        self._info = ModelInfo(
            name=name,
            family=str(cfg.model_type),
            vocab_size=int(model.get_output_embeddings().weight.shape[0]),
            max_context=int(getattr(text_cfg, "max_position_embeddings", 2048)),
            bos_token_id=cfg.bos_token_id,
            eos_token_ids=eos_ids,
            pad_token_id=cfg.pad_token_id,
            num_parameters=sum(p.numel() for p in model.parameters()),
            hidden_size=int(text_cfg.hidden_size),
        )
        layer_types = getattr(text_cfg, "layer_types", None) or ()
        self.tree_masks = (
            getattr(cfg, "_attn_implementation", None) in ("eager", "sdpa")
            and getattr(text_cfg, "sliding_window", None) is None
            and all(kind == "full_attention" for kind in layer_types)
        )

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def device(self) -> torch.device:
        """Where forwards run (``spectune.models.devices``: outputs come back on the CPU)."""
        device: torch.device = self.model.device
        return device

    def new_cache(self, batch_size: int = 1, capacity: int | None = None) -> HFCache:
        if batch_size != 1:
            raise ValueError("the transformers adapter decodes one sequence per cache")
        return HFCache(min(capacity or self._info.max_context, self._info.max_context))

    @torch.inference_mode()
    def forward(
        self,
        tokens: Tensor,  # [1, chunk]
        cache: Any,
        *,
        positions: Tensor | None = None,
        chunk_mask: Tensor | None = None,
        last_only: bool = False,
    ) -> ModelOutput:
        if not isinstance(cache, HFCache):
            raise TypeError("HFModel decodes against the HFCache it created")
        chunk = tokens.shape[1]
        start = cache.length()
        if start + chunk > cache.capacity:
            raise PromptError(f"sequence would exceed the context of {cache.capacity} tokens")
        extra: dict[str, Any] = {}
        if chunk_mask is not None:
            if not self.tree_masks:
                raise NotImplementedError(
                    f"{self._info.name} cannot take a tree attention mask through transformers "
                    "(sliding-window or non-eager/SDPA attention); use the native runtime"
                )
            extra["attention_mask"] = self._tree_mask(start, chunk_mask)
        if last_only and self._keeps_logits:
            extra["logits_to_keep"] = 1
        device = self.model.device
        cache_position = torch.arange(start, start + chunk, device=device)
        if positions is not None:
            positions = positions.to(device)
        out = self.model(
            input_ids=tokens.to(device),
            use_cache=True,
            cache_position=cache_position,
            position_ids=(cache_position[None] if positions is None else positions),
            output_hidden_states=True,
            **{self._cache_arg: cache.inner},
            **extra,
        )
        cache._length = start + chunk
        # Outputs come back on the CPU (``spectune.models.devices``).
        logits = out.logits[:, -1:] if last_only else out.logits
        return ModelOutput(logits=logits.to("cpu"), hidden=out.hidden_states[-1].to("cpu"))

    def _tree_mask(self, start: int, chunk_mask: Tensor) -> Tensor:
        """[1, chunk, chunk] bool (True = may attend) -> [1, 1, chunk, start + chunk] additive
        float mask: the prefix is visible to every query, the chunk as the tree allows."""
        chunk = chunk_mask.shape[-1]
        visible = torch.ones(1, 1, chunk, start + chunk, dtype=torch.bool)
        visible[0, 0, :, start:] = chunk_mask[0]
        dtype = self.model.dtype
        additive = torch.zeros(visible.shape, dtype=dtype).masked_fill(
            ~visible, torch.finfo(dtype).min
        )
        return additive.to(self.model.device)


def load_hf_model(
    path: Path, *, dtype: torch.dtype = torch.float32, allow_missing_weights: bool = False
) -> HFModel:
    """Load through transformers. Its own loading report is silenced (it is a table, not a
    line); what it says about missing, unused or mis-shaped weights is checked here instead
    (``spectune.models.weights.check_weights``: an error unless ``allow_missing_weights``)."""
    from transformers import AutoModelForCausalLM

    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        loaded: Any  # (model, {"missing_keys": [...], "unexpected_keys": [...], ...})
        if path.is_file():
            loaded = _from_gguf(path, dtype)
        else:
            loaded = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dtype, use_safetensors=True, output_loading_info=True
            )
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises many types for bad folders
        raise ModelLoadError(f"cannot load {path} with transformers: {exc}") from exc
    model, report = loaded
    # Shape mismatches only reach the report when ignored (else transformers raises).
    mismatched = [
        entry if isinstance(entry, str) else str(entry[0])
        for entry in report.get("mismatched_keys", ())
    ]
    check_weights(
        path,
        [*report.get("missing_keys", ()), *mismatched],
        list(report.get("unexpected_keys", ())),
        strict=not allow_missing_weights,
    )
    return HFModel(model, name=path.stem if path.is_file() else path.name)


def converted_gguf_path(path: Path) -> Path:
    """Where the de-quantised form of the GGUF at ``path`` is kept (an HF folder; it exists
    once a load has converted the file)."""
    return derived_path(path, "gguf-hf")


def _from_gguf(path: Path, dtype: torch.dtype) -> Any:
    """``from_pretrained``'s (model, loading report) for a GGUF file: from the converted
    folder where a load made one (a damaged one is converted again), else de-quantised
    through transformers at fp32, saved there, then cast to ``dtype``."""
    from transformers import AutoModelForCausalLM

    cached = converted_gguf_path(path)
    if (cached / "config.json").is_file():
        try:
            return AutoModelForCausalLM.from_pretrained(
                str(cached), dtype=dtype, use_safetensors=True, output_loading_info=True
            )
        except Exception:  # damaged (transformers raises many types): convert again
            shutil.rmtree(cached, ignore_errors=True)
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, output_loading_info=True
    )
    model, report = loaded
    # Saved aside then renamed, so a concurrent reader never sees half a folder.
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    try:
        _save_converted(model, tmp)
        os.replace(tmp, cached)
    except OSError:  # a read-only cache, or a concurrent writer: only costs speed
        shutil.rmtree(tmp, ignore_errors=True)
    return (model if dtype == torch.float32 else model.to(dtype)), report


def _save_converted(model: Any, folder: Path) -> None:
    """``model``'s config and weights as an HF folder (transformers' ``save_pretrained``
    refuses a model loaded from a GGUF, so its parts are written one by one; tied weights
    are stored once, as transformers ties them again on load)."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True)
    model.config.save_pretrained(str(folder))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(folder))
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
