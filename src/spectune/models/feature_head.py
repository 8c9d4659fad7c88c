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
``f`` onto ``h``. The target's embedding and output rows are not parameters of the head:
they are attached from the target at load time and never saved with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from spectune.kv_cache import StaticKVCache
from spectune.models.llama import Block, LlamaConfig, RMSNorm, attention_mask, rotary_tables

__all__ = ["FeatureHead", "FeatureHeadConfig"]


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureHeadConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class FeatureHead(nn.Module):
    """fc + one decoder layer + norm; reads frozen target embedding and output rows."""

    def __init__(
        self,
        cfg: FeatureHeadConfig,
        embed_weight: Tensor,  # [target_vocab, hidden] the target's input embedding
        output_weight: Tensor,  # [num_draft_tokens, hidden] the target's lm_head rows
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = Block(cfg.layer_config())
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Frozen and not saved: they belong to the target.
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("output_weight", output_weight.detach(), persistent=False)

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
            dtype=self.fc.weight.dtype,
            device=self.fc.weight.device,
        )

    def logits(self, features: Tensor) -> Tensor:
        """features: [..., hidden] -> [..., num_draft_tokens]."""
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
        its positions and ancestor mask (``spectune.tree.tree_layout``), as for a model.
        """
        embedded = nn.functional.embedding(tokens, self._buffer("embed_weight"))
        x = torch.cat((embedded, prev_features), -1)
        x = self.fc(x.to(self.fc.weight.dtype))
        batch, chunk = tokens.shape
        if cache is None:
            positions = torch.arange(chunk).expand(batch, chunk)
            cos, sin = rotary_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
            x = self.layer(x, cos, sin, None, 0, None, None, 0)
        else:
            slots = cache.slots(chunk)
            mask, used = attention_mask(cache.lengths, chunk, slots, chunk_mask)
            rotary = slots if positions is None else positions
            cos, sin = rotary_tables(rotary, self.cfg.head_dim, self.cfg.rope_theta)
            x = self.layer(x, cos, sin, cache, 0, slots, mask, used)
            cache.advance(chunk)
        features: Tensor = self.norm(x)
        return features
