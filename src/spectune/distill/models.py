"""The two kinds of draft the distiller trains, behind one training interface.

- ``lm``: a small independent Llama-family LM sharing the target's tokenizer. It has its
  own (tied) embedding over the full vocabulary, so it reads any token; with a reduced
  vocabulary its output layer is the subset's rows of that embedding. Exported as an HF
  Llama folder (transformers loads it; spectune restricts the output to the subset).
- ``feature``: an EAGLE-style head over the target's hidden states
  (``spectune.models.feature_head``); the target's embedding and output rows are reused,
  frozen, so only one decoder layer and a projection are trained.

Both map a batch of corpus sequences to (draft logits over the draft vocabulary at the
training positions, predicted features or None, target features or None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from spectune.models.feature_head import FeatureHead, FeatureHeadConfig
from spectune.models.llama import LlamaConfig, LlamaLM, LlamaTransformer, rotary_tables

__all__ = [
    "DraftArchitecture",
    "FeatureDraftModel",
    "LMDraftModel",
    "TrainableDraft",
    "TrainBatch",
]


@dataclass(frozen=True)
class DraftArchitecture:
    """What the user asks for. ``feature`` uses the target's width; layers is ignored."""

    kind: str  # "lm" | "feature"
    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768


@dataclass(frozen=True)
class TrainBatch:
    tokens: Tensor  # [batch, length] int64 (padding after each sequence's end)
    hidden: Tensor  # [batch, length, target_hidden] the target's states (fp32)
    topk_ids: Tensor  # [batch, length, k]
    topk_probs: Tensor  # [batch, length, k]
    loss_mask: Tensor  # [batch, length] bool: position predicts a target-chosen token


@dataclass(frozen=True)
class DraftOutputs:
    logits: Tensor  # [n, num_draft_tokens] at the selected positions
    position_index: tuple[Tensor, Tensor]  # (batch rows, positions) the logits belong to
    predicted: Tensor | None  # [n, hidden] head features, for the regression term
    target_features: Tensor | None  # [n, hidden]


class TrainableDraft(Protocol):
    kind: str

    def module(self) -> nn.Module: ...

    def train_forward(self, batch: TrainBatch) -> DraftOutputs: ...


class LMDraftModel:
    kind = "lm"

    def __init__(self, net: LlamaTransformer, vocab_subset: Tensor | None) -> None:
        self.net = net
        self.vocab_subset = vocab_subset  # [num_draft_tokens] or None

    @classmethod
    def create(
        cls,
        arch: DraftArchitecture,
        target_cfg: LlamaConfig,
        vocab_subset: Tensor | None,
        generator: torch.Generator,
    ) -> LMDraftModel:
        head_dim = arch.hidden_size // arch.num_heads
        cfg = LlamaConfig(
            vocab_size=target_cfg.vocab_size,
            hidden_size=arch.hidden_size,
            intermediate_size=arch.intermediate_size,
            num_layers=arch.num_layers,
            num_heads=arch.num_heads,
            num_kv_heads=arch.num_kv_heads,
            head_dim=head_dim,
            rope_theta=target_cfg.rope_theta,
            rms_norm_eps=target_cfg.rms_norm_eps,
            max_context=target_cfg.max_context,
            tie_word_embeddings=True,
            bos_token_id=target_cfg.bos_token_id,
            eos_token_ids=target_cfg.eos_token_ids,
            pad_token_id=target_cfg.pad_token_id,
            family="llama",
            name="distilled-draft",
        )
        net = LlamaTransformer(cfg)
        with torch.no_grad():
            for name, param in net.named_parameters():
                if "norm" not in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        return cls(net, vocab_subset)

    def module(self) -> nn.Module:
        return self.net

    def train_forward(self, batch: TrainBatch) -> DraftOutputs:
        net = self.net
        tokens = batch.tokens
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        x = net.embed_tokens(tokens)
        cos, sin = rotary_tables(positions, net.cfg.head_dim, net.cfg.rope_theta)
        for i, block in enumerate(net.layers):
            x = block(x, cos, sin, None, i, None, None, 0)
        hidden = net.norm(x)  # [batch, length, hidden]
        rows, cols = batch.loss_mask.nonzero(as_tuple=True)
        selected = hidden[rows, cols]  # [n, hidden]
        weight = net.embed_tokens.weight
        if self.vocab_subset is not None:
            weight = weight[self.vocab_subset]
        return DraftOutputs(selected @ weight.T, (rows, cols), None, None)

    def as_lm(self) -> LlamaLM:
        return LlamaLM(self.net.eval(), name="distilled-draft")


class FeatureDraftModel:
    kind = "feature"

    def __init__(self, head: FeatureHead, vocab_subset: Tensor | None) -> None:
        self.head = head
        self.vocab_subset = vocab_subset

    @classmethod
    def create(
        cls,
        arch: DraftArchitecture,
        target: LlamaTransformer,
        vocab_subset: Tensor | None,
        generator: torch.Generator,
    ) -> FeatureDraftModel:
        tcfg = target.cfg
        cfg = FeatureHeadConfig(
            hidden_size=tcfg.hidden_size,
            intermediate_size=arch.intermediate_size,
            num_heads=tcfg.num_heads,
            num_kv_heads=tcfg.num_kv_heads,
            head_dim=tcfg.head_dim,
            target_vocab_size=tcfg.vocab_size,
            rope_theta=tcfg.rope_theta,
            rms_norm_eps=tcfg.rms_norm_eps,
            max_context=tcfg.max_context,
        )
        head = feature_head_for(cfg, target, vocab_subset)
        with torch.no_grad():
            for name, param in head.named_parameters():
                if "norm" not in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
            # Start near "the next state is the previous one": the fc passes h through.
            hidden = tcfg.hidden_size
            head.fc.weight[:, hidden:] += torch.eye(hidden)
            head.norm.weight.copy_(target.norm.weight)
        return cls(head, vocab_subset)

    def module(self) -> nn.Module:
        return self.head

    def train_forward(self, batch: TrainBatch) -> DraftOutputs:
        # Head position t (t >= 1) reads token t and h[t - 1]; it predicts token t + 1, whose
        # soft labels are stored at t, and its features regress onto h[t].
        features = self.head(batch.tokens[:, 1:], batch.hidden[:, :-1])  # [batch, L-1, hidden]
        mask = batch.loss_mask[:, 1:]
        rows, cols = mask.nonzero(as_tuple=True)
        selected = features[rows, cols]
        logits = self.head.logits(selected)
        return DraftOutputs(logits, (rows, cols + 1), selected, batch.hidden[rows, cols + 1])


def feature_head_for(
    cfg: FeatureHeadConfig, target: LlamaTransformer, vocab_subset: Tensor | None
) -> FeatureHead:
    """A head wired to the target's frozen embedding and (subset of) output rows, on the
    CPU where drafts train (a target on a GPU only generates the corpus)."""
    output = target.lm_head.weight.detach().to("cpu")
    if vocab_subset is not None:
        output = output[vocab_subset]
    embedding = target.embed_tokens.weight.detach().to("cpu")
    return FeatureHead(cfg, embedding, output.clone())
