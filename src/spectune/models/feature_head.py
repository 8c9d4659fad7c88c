"""A feature-level draft head in the style of EAGLE (Li et al. 2024).

Glossary:
- target feature ``h[t]``  the target's last hidden state at position t (after its final
                           norm): the state from which the target predicts token t + 1.
- head input at t          ``fc(concat(embed(token[t]), h[t - 1]))``: the token just
                           written plus the state that predicted it. Position 0 has no
                           input (there is no h[-1]); head slot s holds position s + 1.
- head output ``f[t]``     one Llama decoder layer over the inputs (causal attention over
                           earlier head slots), then an RMSNorm: an estimate of ``h[t]``.
- draft logits             ``f[t] @ lm_head[vocab_subset].T``: the target's own output rows,
                           frozen, optionally only the N most frequent tokens.

Drafting several tokens feeds ``f`` back where the target's ``h`` is not known yet
(``f[t]`` stands in for ``h[t]`` at position t + 1), which is why training also regresses
``f`` onto ``h`` or, as EAGLE-3 does (Li et al. 2025), unrolls the head on its own outputs
("training-time test", ``spectune.distill.models``).

Multi-layer features (EAGLE-3): with ``feature_layers`` set, ``h[t]`` is not the last
hidden state but ``fuse(concat(states of those target layers))``: the target exposes the
concatenated states (``LlamaLM.expose_layers``) and ``target_input`` projects them to the
head's width (each layer's state scaled to unit RMS first), so low and middle layers,
which still carry what the next tokens will be, reach the head. Everything after the
fusion is as above.

EAGLE-3 layout (``layout="eagle3"``, the layer vLLM and ``speculators`` run): the decoder
layer reads the embedding and the state side by side instead of their projection. Its
attention sees ``concat(input_layernorm(embed(token[t])), hidden_norm(h[t - 1]))`` (twice
the width) and its residual stream starts from ``hidden_norm(h[t - 1])``; there is no
``fc``. A multi-layer head needs it to be served by vLLM (``spectune.engines.vllm.eagle3``
writes it in vLLM's format); the default layout cannot be mapped onto it weight for weight.

The target's embedding and output rows are not parameters of the head: they are attached
from the target at load time and never saved with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from spectune.models.kv_cache import StaticKVCache
from spectune.models.llama import (
    MLP,
    Attention,
    Block,
    LlamaConfig,
    RMSNorm,
    attention_mask,
    rotary_tables,
)
from spectune.models.names import LAYOUTS
from spectune.models.quant import QuantMode, quantize_net

__all__ = ["LAYOUTS", "Eagle3Layer", "FeatureHead", "FeatureHeadConfig"]


@dataclass(frozen=True)
class FeatureHeadConfig:
    hidden_size: int  # the target's
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_context: int = 2048
    feature_layers: tuple[int, ...] = ()  # target layers fused into h; () = last state only
    layout: str = "spectune"  # "spectune": fc then a Llama layer; "eagle3": vLLM's layer

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown head layout {self.layout!r} (one of {', '.join(LAYOUTS)})")
        if self.layout == "eagle3" and not self.feature_layers:
            raise ValueError("an EAGLE-3-layout head reads several target layers: give them")

    def layer_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.target_vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=1,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            max_context=self.max_context,
        )

    @property
    def state_size(self) -> int:
        """Width of the target states the head reads: hidden size times the fused layers."""
        return self.hidden_size * max(1, len(self.feature_layers))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["feature_layers"] = list(self.feature_layers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureHeadConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["feature_layers"] = tuple(values.get("feature_layers", ()))
        return cls(**values)


class Eagle3Layer(nn.Module):
    """vLLM's EAGLE-3 decoder layer (``llama_eagle3.LlamaDecoderLayer``, layer 0, with
    ``norm_before_residual``): attention over the normed embedding and the normed state
    side by side ([..., 2 * hidden]), its residual stream starting from the normed state."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # on the embedding
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # on the state
        self.self_attn = Attention(cfg)
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        wide = 2 * cfg.hidden_size
        self.self_attn.q_proj = nn.Linear(wide, q_out, bias=False)
        self.self_attn.k_proj = nn.Linear(wide, kv_out, bias=False)
        self.self_attn.v_proj = nn.Linear(wide, kv_out, bias=False)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        embedded: Tensor,  # [batch, chunk, hidden] the tokens' embeddings
        states: Tensor,  # [batch, chunk, hidden] h (or f) at the position before each
        cos: Tensor,
        sin: Tensor,
        cache: Any,  # a StaticKVCache, an unroll's key store, or None (causal, training)
        slots: Tensor | None,
        mask: Tensor | None,
        used: int,
    ) -> Tensor:
        # Norm before the residual: the attention and the residual stream both read the
        # normed state.
        residual: Tensor = self.hidden_norm(states)
        both = torch.cat((self.input_layernorm(embedded), residual), dim=-1)  # [..., 2 * hidden]
        attended: Tensor = self.self_attn(both, cos, sin, cache, 0, slots, mask, used)
        x = residual + attended
        mlp_out: Tensor = self.mlp(self.post_attention_layernorm(x))
        return x + mlp_out


class FeatureHead(nn.Module):
    """(fuse) + fc + one decoder layer + norm, or in the EAGLE-3 layout fuse + its layer +
    norm; reads frozen target embedding and output rows."""

    def __init__(
        self,
        cfg: FeatureHeadConfig,
        embed_weight: Tensor,  # [target_vocab, hidden] the target's input embedding
        output_weight: Tensor,  # [num_draft_tokens, hidden] the target's lm_head rows
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.fuse = (
            nn.Linear(cfg.state_size, cfg.hidden_size, bias=False) if cfg.feature_layers else None
        )
        # The default layout projects (embedding, state) to one vector for a Llama layer;
        # the EAGLE-3 layout's layer reads them side by side (``Eagle3Layer``), with no fc.
        self.fc: nn.Linear | None = None
        self.layer: Block | Eagle3Layer
        if cfg.layout == "eagle3":
            self.layer = Eagle3Layer(cfg.layer_config())
        else:
            self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
            self.layer = Block(cfg.layer_config())
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Frozen and not saved: they belong to the target.
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("output_weight", output_weight.detach(), persistent=False)
        # Set by ``quantize``: the output rows on a weight-only kernel (else a float matmul).
        self.output: nn.Module | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the head's activations and cache (its layers may be quantised)."""
        return self.norm.weight.dtype

    def quantize(self, mode: QuantMode) -> None:
        """Put the head's linear layers and output rows on PyTorch's weight-only CPU kernels
        (``spectune.models.quant``), in place: inference only. A head drafting for a
        quantised target would otherwise read more bytes per step, relative to a target
        step, than it was meant to (c)."""
        if mode == "none":
            return
        quantize_net(self, mode)
        rows = self._buffer("output_weight")
        output = nn.Linear(rows.shape[1], rows.shape[0], bias=False)
        output.weight = nn.Parameter(rows.float(), requires_grad=False)
        holder = nn.ModuleDict({"output": output})
        quantize_net(holder, mode)
        self.output = holder["output"]
        self.register_buffer("output_weight", torch.empty(0, rows.shape[1]), persistent=False)

    def _buffer(self, name: str) -> Tensor:
        value = getattr(self, name)
        assert isinstance(value, Tensor)
        return value

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, capacity: int, batch_size: int = 1) -> StaticKVCache:
        cfg = self.cfg
        return StaticKVCache(
            num_layers=1,
            batch_size=batch_size,
            capacity=capacity,
            kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=self.dtype,
            device=self.norm.weight.device,
        )

    def target_input(self, states: Tensor) -> Tensor:
        """The target's exposed states [..., state_size] -> the head's h [..., hidden]."""
        if states.shape[-1] != self.cfg.state_size:
            raise ValueError(
                f"the head reads target states of width {self.cfg.state_size}, got "
                f"{states.shape[-1]} (feature layers {self.cfg.feature_layers or 'last'})"
            )
        states = states.to(self.dtype)
        if self.fuse is None:
            return states
        # Each layer's residual state is scaled to unit RMS before the projection: middle
        # layers carry massive activations (SmolLM2's layer 15 reaches |x| ~ 25,000 on a few
        # positions against an RMS of ~8), which would otherwise dominate fuse's gradients.
        layers = states.reshape(*states.shape[:-1], len(self.cfg.feature_layers), -1)
        scale = torch.rsqrt(layers.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        fused: Tensor = self.fuse((layers * scale).flatten(-2))
        return fused

    def logits(self, features: Tensor) -> Tensor:
        """features: [..., hidden] -> [..., num_draft_tokens]."""
        if self.output is not None:
            quantised: Tensor = self.output(features)
            return quantised
        output: Tensor = features @ self._buffer("output_weight").T
        return output

    def forward(
        self,
        tokens: Tensor,  # [batch, chunk] the tokens at the head positions
        prev_features: Tensor,  # [batch, chunk, hidden] h (or f) at the position before each
        cache: StaticKVCache | None = None,
        *,
        positions: Tensor | None = None,  # [batch, chunk] rotary positions; default: slots
        chunk_mask: Tensor | None = None,  # [batch, chunk, chunk] bool; default: causal
    ) -> Tensor:
        """Returns the head's features f: [batch, chunk, hidden].

        Without a cache: a causal pass over whole sequences (training). With a cache: the
        chunk is appended after the cache's current length (decoding); a token tree passes
        its positions and ancestor mask (``spectune.draft.tree_layout``), as for a model.
        """
        batch, chunk = tokens.shape
        if cache is None:
            positions = torch.arange(chunk, device=tokens.device).expand(batch, chunk)
            cos, sin = rotary_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
            x = self._layer(tokens, prev_features, cos, sin, None, None, None, 0)
        else:
            slots = cache.slots(chunk)
            mask, used = attention_mask(cache.lengths, chunk, slots, chunk_mask)
            rotary = slots if positions is None else positions
            cos, sin = rotary_tables(rotary, self.cfg.head_dim, self.cfg.rope_theta)
            x = self._layer(tokens, prev_features, cos, sin, cache, slots, mask, used)
            cache.advance(chunk)
        features: Tensor = self.norm(x)
        return features

    def _layer(
        self,
        tokens: Tensor,  # [batch, chunk]
        prev_features: Tensor,  # [batch, chunk, hidden]
        cos: Tensor,
        sin: Tensor,
        cache: Any,
        slots: Tensor | None,
        mask: Tensor | None,
        used: int,
    ) -> Tensor:
        """The decoder layer over (embed(token[t]), h[t - 1]): [batch, chunk, hidden] before
        the final norm. Default layout: the layer reads fc(concat(embedding, state))."""
        embedded = nn.functional.embedding(tokens, self._buffer("embed_weight"))
        if isinstance(self.layer, Eagle3Layer):
            states = prev_features.to(self.dtype)
            eagle3: Tensor = self.layer(
                embedded.to(self.dtype), states, cos, sin, cache, slots, mask, used
            )
            return eagle3
        assert self.fc is not None
        x = torch.cat((embedded, prev_features.to(embedded.dtype)), -1)
        out: Tensor = self.layer(self.fc(x.to(self.dtype)), cos, sin, cache, 0, slots, mask, used)
        return out

    def forward_masked(
        self,
        tokens: Tensor,  # [batch, n]
        prev_features: Tensor,  # [batch, n, hidden]
        keys: Any,  # the unroll's key/value store (``write``/``view``), see distill.models
        positions: Tensor,  # [batch, n] rotary positions
        mask: Tensor,  # [batch, 1, n, keys held after this step] bool, True = may attend
    ) -> Tensor:
        """One training-time-test step over whole sequences: the chunk's keys join
        ``keys`` and the queries see what ``mask`` allows. Returns f: [batch, n, hidden]."""
        cos, sin = rotary_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self._layer(tokens, prev_features, cos, sin, keys, positions, mask, 0)
        features: Tensor = self.norm(x)
        return features
