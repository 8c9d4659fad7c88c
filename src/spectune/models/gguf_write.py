"""Write a Llama-style draft (an HF folder: ``config.json`` + ``model.safetensors``, as
``spectune distill --kind lm`` saves) as a GGUF file that llama.cpp loads as a draft model.

The vocabulary and tokenizer come from the target's GGUF, copied key by key, so llama.cpp's
draft/target vocabulary check passes by construction. Weights are written as F16 (norms
F32); q/k rows get llama.cpp's rotary re-ordering (the inverse of
``spectune.models.loading._unpermute``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from spectune.errors import InvalidParameterError
from spectune.models.loading import _GGUF_NAMES

__all__ = ["write_draft_gguf"]


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Half-split rotary rows -> llama.cpp's interleaved order."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _copy_tokenizer(writer: object, target: Path) -> int:
    """Copy every ``tokenizer.*`` key of the target GGUF; return its vocabulary size."""
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    reader = gguf.GGUFReader(str(target))
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            values = field.contents()
            writer.add_key_value(key, values, kind, sub_type=field.types[-1])
            if key == "tokenizer.ggml.tokens":
                vocab = len(values)
        else:
            writer.add_key_value(key, field.contents(), kind)
    return vocab


def write_draft_gguf(folder: Path, target: Path, out: Path) -> Path:
    """Convert the LM draft in ``folder`` to ``out`` (GGUF), with ``target``'s tokenizer."""
    import gguf
    from safetensors.numpy import load_file

    config_file, weights_file = folder / "config.json", folder / "model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise InvalidParameterError(
            f"{folder}: not a draft folder (config.json, model.safetensors)"
        )
    if target.suffix != ".gguf" or not target.is_file():
        raise InvalidParameterError(f"{target}: the tokenizer comes from the target's GGUF file")
    cfg = json.loads(config_file.read_text())
    if cfg.get("model_type") != "llama":
        raise InvalidParameterError(
            f"{folder}: a {cfg.get('model_type')!r} draft; llama.cpp takes a Llama-style draft "
            "(spectune distill --kind lm)"
        )
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim", hidden // heads))
    tensors = load_file(str(weights_file))

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(folder.name)
    writer.add_block_count(int(cfg["num_hidden_layers"]))
    writer.add_context_length(int(cfg.get("max_position_embeddings", 8192)))
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(int(cfg["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = _copy_tokenizer(writer, target)
    if vocab != int(cfg["vocab_size"]):
        raise InvalidParameterError(
            f"{folder}: vocabulary {cfg['vocab_size']} against the target's {vocab}; llama.cpp "
            "needs the draft to share the target's vocabulary (no --vocab-size subset)"
        )
    writer.add_vocab_size(vocab)

    def add(name: str, value: np.ndarray) -> None:
        kind = np.float32 if value.ndim == 1 else np.float16
        writer.add_tensor(name, np.ascontiguousarray(value.astype(kind)))

    add("token_embd.weight", tensors["model.embed_tokens.weight"])
    add("output_norm.weight", tensors["model.norm.weight"])
    if "lm_head.weight" in tensors and not cfg.get("tie_word_embeddings", False):
        add("output.weight", tensors["lm_head.weight"])
    for layer in range(int(cfg["num_hidden_layers"])):
        for short, long in _GGUF_NAMES.items():
            value = tensors[f"model.layers.{layer}.{long}.weight"]
            if short == "attn_q":
                value = _permute(value, heads)
            elif short == "attn_k":
                value = _permute(value, kv_heads)
            add(f"blk.{layer}.{short}.weight", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
