"""The two kinds of draft the distiller trains, behind one training interface.

- ``lm``: a small independent Llama-family LM sharing the target's tokenizer. It has its
  own (tied) embedding over the full vocabulary, so it reads any token; with a reduced
  vocabulary its output layer is the subset's rows of that embedding. Exported as an HF
  Llama folder (transformers loads it; spectune restricts the output to the subset).
- ``gpt2``: a small LM of another architecture family (GPT-2: learned absolute positions,
  LayerNorm, a two-matrix GELU MLP, biases; transformers' ``GPT2LMHeadModel``) over the
  same tokenizer and full vocabulary, so a draft's family can be compared at equal size
  and training. Exported as an HF GPT-2 folder; spectune runs it through transformers.
- ``feature``: an EAGLE-style head over the target's hidden states
  (``spectune.models.feature_head``); the target's embedding and output rows are reused,
  frozen, so only one decoder layer and a projection are trained.

Both map a batch of corpus sequences to (draft logits over the draft vocabulary at the
training positions, predicted features or None, target features or None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from spectune.errors import InvalidParameterError
from spectune.models.feature_head import LAYOUTS, FeatureHead, FeatureHeadConfig
from spectune.models.llama import LlamaConfig, LlamaLM, LlamaTransformer, rotary_tables

__all__ = [
    "DraftArchitecture",
    "FeatureDraftModel",
    "GPT2DraftModel",
    "LMDraftModel",
    "TrainableDraft",
    "TrainBatch",
]


@dataclass(frozen=True)
class DraftArchitecture:
    """What the user asks for. ``feature`` uses the target's width; layers is ignored.

    ``feature_layers``: target layers a feature head fuses (EAGLE-3; () = last state only).
    ``unroll``: draft positions trained per position (training-time test; 1 = EAGLE-1).
    ``layout``: a feature head's layer (``FeatureHeadConfig.layout``; "eagle3" is vLLM's).
    """

    kind: str  # "lm" | "gpt2" | "feature"
    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768
    feature_layers: tuple[int, ...] = ()
    unroll: int = 1
    layout: str = "spectune"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InvalidParameterError(
                f"unknown head layout {self.layout!r} (one of {', '.join(LAYOUTS)})"
            )
        sizes = {
            "layers": self.num_layers,
            "hidden": self.hidden_size,
            "heads": self.num_heads,
            "kv heads": self.num_kv_heads,
            "ffn": self.intermediate_size,
        }
        for name, value in sizes.items():
            if value < 1:
                raise InvalidParameterError(f"the draft's {name} must be >= 1, got {value}")
        if self.unroll < 1:
            raise InvalidParameterError(f"--unroll must be >= 1, got {self.unroll}")
        if self.hidden_size % self.num_heads:
            raise InvalidParameterError(
                f"the draft's hidden size {self.hidden_size} is not a multiple of its "
                f"{self.num_heads} heads"
            )
        if self.num_heads % self.num_kv_heads:
            raise InvalidParameterError(
                f"the draft's {self.num_heads} heads are not a multiple of its "
                f"{self.num_kv_heads} kv heads"
            )

    def record(self) -> dict[str, object]:
        """The fields that shaped the draft, for its training record: a feature head takes
        the target's width, heads and one layer, so those requested sizes are left out; the
        layout is named only where it is not the default (records before it stay as they
        were)."""
        fields = asdict(self)
        if self.kind != "feature" or self.layout == "spectune":
            del fields["layout"]
        if self.kind == "feature":
            for ignored in ("num_layers", "hidden_size", "num_heads", "num_kv_heads"):
                del fields[ignored]
        return fields


@dataclass(frozen=True)
class TrainBatch:
    tokens: Tensor  # [batch, length] int64 (padding after each sequence's end)
    hidden: Tensor  # [batch, length, state_size] the target's exposed states (fp32)
    topk_ids: Tensor  # [batch, length, k]
    topk_probs: Tensor  # [batch, length, k]
    loss_mask: Tensor  # [batch, length] bool: position predicts a target-chosen token


@dataclass(frozen=True)
class DraftOutputs:
    logits: Tensor  # [n, num_draft_tokens] at the selected positions
    position_index: tuple[Tensor, Tensor]  # (batch rows, positions) the logits belong to
    predicted: Tensor | None  # [m, hidden] head features, for the regression term
    target_features: Tensor | None  # [m, hidden]
    draft_position: Tensor | None = None  # [n] 0 = first draft token, 1 = second, ...


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
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
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


class GPT2DraftModel:
    """A GPT-2-style draft (``transformers.GPT2LMHeadModel``, tied embedding). Its MLP has two
    matrices where Llama's has three, so its inner width is 1.5x ``intermediate_size``:
    the same parameters per block, give or take biases and norms. Learned positions cover
    ``positions`` tokens (the contexts drafts see in evaluation; not the target's context)."""

    kind = "gpt2"

    def __init__(self, model: Any) -> None:
        self.model = model  # transformers.GPT2LMHeadModel
        self.vocab_subset: Tensor | None = None  # always the full vocabulary

    @classmethod
    def create(
        cls,
        arch: DraftArchitecture,
        target_cfg: LlamaConfig,
        generator: torch.Generator,
        *,
        positions: int = 1024,
    ) -> GPT2DraftModel:
        from transformers import GPT2Config, GPT2LMHeadModel

        eos = target_cfg.eos_token_ids[0] if target_cfg.eos_token_ids else None
        config = GPT2Config(
            vocab_size=target_cfg.vocab_size,
            n_positions=positions,
            n_embd=arch.hidden_size,
            n_layer=arch.num_layers,
            n_head=arch.num_heads,
            n_inner=arch.intermediate_size * 3 // 2,
            bos_token_id=target_cfg.bos_token_id,
            eos_token_id=eos,
            pad_token_id=target_cfg.pad_token_id,
            tie_word_embeddings=True,
        )
        model = GPT2LMHeadModel(config)
        with torch.no_grad():  # transformers initialises from the global RNG; ours is injected
            for name, param in model.named_parameters():
                if ".ln_" in name or name.startswith("transformer.ln_f"):
                    continue
                if name.endswith(".bias"):
                    param.zero_()
                else:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        return cls(model)

    def module(self) -> nn.Module:
        module: nn.Module = self.model
        return module

    def train_forward(self, batch: TrainBatch) -> DraftOutputs:
        hidden = self.model.transformer(input_ids=batch.tokens).last_hidden_state
        rows, cols = batch.loss_mask.nonzero(as_tuple=True)
        selected = hidden[rows, cols]  # [n, hidden]
        weight = self.model.transformer.wte.weight  # tied with the output layer
        return DraftOutputs(selected @ weight.T, (rows, cols), None, None)


class _UnrollCache:
    """Keys and values of the unroll steps so far, for one decoder layer: step j's queries
    attend over steps 0..j (the mask says which). Duck-types the two ``StaticKVCache``
    verbs the attention calls; nothing is written in place, so autograd sees plain
    concatenations."""

    def __init__(self) -> None:
        self.keys: list[Tensor] = []  # per step: [batch, kv_heads, n, head_dim]
        self.values: list[Tensor] = []

    def write(self, layer: int, slots: Tensor, keys: Tensor, values: Tensor) -> None:
        self.keys.append(keys.transpose(1, 2))
        self.values.append(values.transpose(1, 2))

    def view(self, layer: int, used: int) -> tuple[Tensor, Tensor]:
        return torch.cat(self.keys, dim=2), torch.cat(self.values, dim=2)


def unroll_mask(n: int, step: int, device: torch.device | None = None) -> Tensor:
    """[n, (step + 1) * n] bool: what head slot i at unroll step ``step`` may see.

    At step j slot i plays the j-th draft token after a draft started at slot i - j: it
    sees the slots built from real target states up to i - j (step 0) and the draft's own
    slots i - j + m at steps m = 1..j, exactly the cache a drafter holds at that point.
    """
    index = torch.arange(n, device=device)
    parts = [index[None, :] <= (index[:, None] - step)]  # step 0: real-state prefix
    for m in range(1, step + 1):
        parts.append(index[None, :] == (index[:, None] - step + m))
    return torch.cat(parts, dim=1)


class FeatureDraftModel:
    kind = "feature"

    def __init__(self, head: FeatureHead, vocab_subset: Tensor | None, *, unroll: int = 1) -> None:
        if unroll < 1:
            raise ValueError(f"unroll must be >= 1, got {unroll}")
        self.head = head
        self.vocab_subset = vocab_subset
        self.unroll = unroll

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
            feature_layers=arch.feature_layers,
            layout=arch.layout,
        )
        head = feature_head_for(cfg, target, vocab_subset)
        with torch.no_grad():
            for name, param in head.named_parameters():
                if "norm" not in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
            # Start near "the next state is the previous one": the fc passes h through
            # (the EAGLE-3 layout's residual stream starts from h already), and a fusion
            # starts by passing the last fused layer through.
            hidden = tcfg.hidden_size
            if head.fc is not None:
                head.fc.weight[:, hidden:] += torch.eye(hidden)
            if head.fuse is not None:
                head.fuse.weight[:, -hidden:] += torch.eye(hidden)
            head.norm.weight.copy_(target.norm.weight)
        return cls(head, vocab_subset, unroll=arch.unroll)

    def module(self) -> nn.Module:
        return self.head

    def train_forward(self, batch: TrainBatch) -> DraftOutputs:
        """Head slot i holds position t = i + 1: it reads token t and h[t - 1] and predicts
        token t + 1, whose soft labels are stored at t.

        Unroll step 0 reads the target's h (the first draft token). Step j >= 1 reads the
        head's own output of step j - 1 at the slot before instead (the (j+1)-th draft
        token), under ``unroll_mask``: the training-time test of EAGLE-3, so what the
        head sees in training is what it sees when drafting, and the loss at each step
        teaches it to use its own features. A single-layer head's step-0 features also
        regress onto the target's next state (EAGLE-1); a fused head has no such target.
        """
        head = self.head
        tokens = batch.tokens[:, 1:]  # [batch, n]
        n = tokens.shape[1]
        prev = head.target_input(batch.hidden[:, :-1])  # [batch, n, hidden] h[t - 1]
        valid = batch.loss_mask[:, 1:]  # [batch, n]
        device = tokens.device
        positions = torch.arange(n, device=device).expand_as(tokens)
        cache = _UnrollCache()
        logits: list[Tensor] = []
        rows_all: list[Tensor] = []
        cols_all: list[Tensor] = []
        steps: list[Tensor] = []
        predicted = target = None
        features = prev
        for step in range(self.unroll):
            if step > 0:
                # Slot i now reads the head's own output at slot i - 1 (slot 0 reads zeros
                # and is never scored: a step-j draft needs a start at slot i - j >= 0).
                prev = torch.cat((torch.zeros_like(features[:, :1]), features[:, :-1]), dim=1)
                valid = valid & (torch.arange(n, device=device) >= step)[None, :]
            mask = unroll_mask(n, step, device)[None, None].expand(tokens.shape[0], 1, n, -1)
            features = head.forward_masked(tokens, prev, cache, positions, mask)
            rows, cols = valid.nonzero(as_tuple=True)
            selected = features[rows, cols]  # [m, hidden]
            logits.append(head.logits(selected))
            rows_all.append(rows)
            cols_all.append(cols + 1)
            steps.append(torch.full_like(rows, step))
            if step == 0 and head.fuse is None:
                predicted, target = selected, batch.hidden[rows, cols + 1]
        return DraftOutputs(
            torch.cat(logits),
            (torch.cat(rows_all), torch.cat(cols_all)),
            predicted,
            target,
            torch.cat(steps),
        )


def feature_head_for(
    cfg: FeatureHeadConfig, target: LlamaTransformer, vocab_subset: Tensor | None
) -> FeatureHead:
    """A head wired to the target's frozen embedding and (subset of) output rows, on the
    CPU (``distill`` moves it to the device it trains on)."""
    output = target.lm_head.weight.detach().to("cpu")
    if vocab_subset is not None:
        output = output[vocab_subset]
    embedding = target.embed_tokens.weight.detach().to("cpu")
    return FeatureHead(cfg, embedding, output.clone())
