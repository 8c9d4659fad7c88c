"""Tiny llama-architecture GGUF files of toy models, written with the ``gguf`` package: the
quantised native runtime and the llama.cpp backend read the same file."""

from __future__ import annotations

from pathlib import Path

import gguf
import torch

from spectune.models.llama import LlamaLM

Q = gguf.GGMLQuantizationType

_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def write_gguf(path: Path, model: LlamaLM, layer_type: Q, *, vocabulary: bool = False) -> None:
    """``model``'s weights as a GGUF: linear layers as ``layer_type``, the (tied) embedding
    as Q8_0, norms as F32. ``vocabulary``: also a made-up SentencePiece vocabulary of the
    model's size (llama.cpp refuses a file without one; the native runtime ignores it)."""
    cfg = model.net.cfg
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_context)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_vocab_size(cfg.vocab_size)
    if vocabulary:
        special = ["<unk>", "<s>", "</s>"]
        # With room for them, the 256 byte tokens: llama.cpp's tokenizer then takes any text
        # (byte fallback), as llama-server's text endpoints need.
        byte_tokens = [f"<0x{b:02X}>" for b in range(256)] if cfg.vocab_size >= 259 else []
        head = special + byte_tokens
        tokens = head + [f"t{i}" for i in range(len(head), cfg.vocab_size)]
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([0.0] * len(tokens))
        writer.add_token_types(
            [gguf.TokenType.CONTROL] * len(special)
            + [gguf.TokenType.BYTE] * len(byte_tokens)
            + [gguf.TokenType.NORMAL] * (len(tokens) - len(head))
        )
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_chat_template(  # plain turns, so that llama-server's chat endpoint works
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        )

    def add(name: str, values: torch.Tensor, kind: Q) -> None:
        array = values.detach().float().numpy()
        if kind == Q.F32:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)

    add("token_embd.weight", model.net.embed_tokens.weight, Q.Q8_0)
    add("output_norm.weight", model.net.norm.weight, Q.F32)
    for i, block in enumerate(model.net.layers):
        for module, short in _NAMES.items():
            weight = block.get_submodule(module).weight
            add(f"blk.{i}.{short}.weight", weight, Q.F32 if "norm" in module else layer_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
