"""Tiny Llama-family models with fixed seeds, for tests and examples (no downloads).

They run on the native runtime, so every test of the engine exercises the same code as
the real model. ``perturbed`` makes a draft that agrees with its target often but not
always, which is what acceptance tests need.
"""

from __future__ import annotations

import copy

import torch

from spectune.models.llama import LlamaConfig, LlamaLM, LlamaTransformer

__all__ = ["perturbed", "toy_config", "toy_model"]


def toy_config(
    *,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_context: int = 512,
    eos_token_id: int = 2,
) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_context=max_context,
        eos_token_ids=(eos_token_id,),
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
        name="toy",
    )


def toy_model(seed: int = 0, *, config: LlamaConfig | None = None, scale: float = 1.0) -> LlamaLM:
    """A random model. ``scale`` sharpens its next-token distributions (std of the embeddings)."""
    cfg = config or toy_config()
    generator = torch.Generator().manual_seed(seed)
    net = LlamaTransformer(cfg)
    with torch.no_grad():
        for name, param in net.named_parameters():
            if "norm" in name:
                continue
            std = (scale if "lm_head" in name else 1.0) / param.shape[-1] ** 0.5
            std = 1.0 if "embed" in name else std
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return LlamaLM(net, name=f"toy-{seed}")


def perturbed(model: LlamaLM, noise: float, seed: int = 1) -> LlamaLM:
    """A copy of ``model`` with Gaussian noise of relative size ``noise`` on every weight."""
    net = copy.deepcopy(model.net)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in net.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * noise)
    return LlamaLM(net, name=f"{model.info.name}+noise{noise}")
