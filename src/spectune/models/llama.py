"""Native runtime for the Llama family in plain PyTorch.

Covers RMSNorm + rotary embeddings + grouped-query attention + SwiGLU, i.e. Llama,
SmolLM, Qwen2 (with q/k/v biases) and Mistral-style checkpoints. The same module trains
(``cache=None``: plain causal attention over the whole sequence, used by distillation)
and decodes (against a ``StaticKVCache``, where rollback is O(1)).

Hot path: ``LlamaLM.forward``. On CPU a decode step is memory-bandwidth bound (the
weights are read once per forward), so verifying K + 1 tokens costs little more than one.

Batch invariance (``LlamaLM.batch_invariant``): speculative greedy output equals plain
greedy output only if a position's logits do not depend on which other rows share its
forward. PyTorch's weight-only int4/int8 kernels compute every row alike whatever the row
count, and so do the norms and element-wise ops; attention does not (SDPA's result for a
query moves in the last bits with the number of queries and with masked keys), and in
bf16 or int4/int8's bf16 kernel inputs those bits can flip a near-tie. With
``batch_invariant`` each query row of a short forward (at most ``ROW_EXACT_MAX_ROWS``:
decode steps, verification, trees; not long prompt prefills) attends in its own SDPA call
over exactly the slots it sees, the very call one-token decoding makes, so on int4/int8
a verified position's logits are bit-identical to plain decoding's (``test_quant``).
fp32 and bf16 matmuls themselves vary with the row count, so there it buys nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spectune.errors import InvalidParameterError, PromptError
from spectune.models.base import ModelInfo, ModelOutput
from spectune.models.kv_cache import StaticKVCache
from spectune.models.names import COMPILED

__all__ = [
    "COMPILED",
    "ROW_EXACT_MAX_ROWS",
    "ChainRows",
    "LlamaConfig",
    "LlamaLM",
    "LlamaTransformer",
    "RowKeys",
    "truncated",
]

# A runtime whose forwards after the prompt are compiled (``LlamaLM.compile_steps``) is
# named by its precision and COMPILED (spectune.models.names): "int4+compile".

# Forwards of up to this many rows attend row by row when batch invariance is on: every
# decode step, verification chunk and tree; longer prompt prefills stay one SDPA call (a
# prefill is the same in plain and speculative decoding, so it needs no invariance).
ROW_EXACT_MAX_ROWS = 64


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_context: int = 2048
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen2 has biases on q/k/v
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)
    pad_token_id: int | None = None
    family: str = "llama"
    name: str = "llama"

    def model_info(self, *, name: str, num_parameters: int) -> ModelInfo:
        """What pairing and decoding need to know of a model with this configuration."""
        return ModelInfo(
            name=name,
            family=self.family,
            vocab_size=self.vocab_size,
            max_context=self.max_context,
            bos_token_id=self.bos_token_id,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            num_parameters=num_parameters,
            hidden_size=self.hidden_size,
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["eos_token_ids"] = tuple(values.get("eos_token_ids", (2,)))
        return cls(**values)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 like the reference implementation, then cast back.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin for rotary embeddings. positions: [batch, chunk] -> 2 x [batch, chunk, head_dim]."""
    steps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
    inv_freq = 1.0 / (theta ** (steps / head_dim))
    angles = positions.float()[..., None] * inv_freq  # [batch, chunk, head_dim / 2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [batch, chunk, heads, head_dim]; cos/sin: [batch, chunk, head_dim]. Half-split layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, :, None, :].to(x.dtype) + rotated * sin[:, :, None, :].to(x.dtype)


@dataclass(frozen=True)
class RowKeys:
    """Batch-invariant attention: per query row, ``(sequence, chunk row, seen)`` with
    ``seen`` the cache slots the row attends to: a prefix ``slice(0, n)``, or in a token
    tree the prefix and the node's ancestors as an index (``row_keys``)."""

    rows: tuple[tuple[int, int, slice | Tensor], ...]

    def attend(self, queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """queries [batch, heads, chunk, dim]; keys/values [batch, kv_heads, slots, dim]
        -> [batch, heads, chunk, dim], each row by the call one-token decoding makes."""
        out = torch.empty_like(queries)
        for b, i, seen in self.rows:
            out[b, :, i] = F.scaled_dot_product_attention(
                queries[b : b + 1, :, i : i + 1],
                keys[b : b + 1, :, seen],
                values[b : b + 1, :, seen],
                enable_gqa=True,
            )[0, :, 0]
        return out


def row_keys(lengths: list[int], chunk: int, chunk_mask: Tensor | None) -> RowKeys:
    """The slots each query row of a chunk sees: its sequence's prefix and, inside the
    chunk, the earlier rows (a chain) or the rows ``chunk_mask`` shows it (a tree)."""
    rows: list[tuple[int, int, slice | Tensor]] = []
    for b, length in enumerate(lengths):
        for i in range(chunk):
            seen: slice | Tensor = slice(0, length + i + 1)
            if chunk_mask is not None:
                inside = chunk_mask[b, i].nonzero()[:, 0].cpu()
                if not torch.equal(inside, torch.arange(i + 1)):
                    index = torch.cat((torch.arange(length), inside + length))
                    seen = index.to(chunk_mask.device)
            rows.append((b, i, seen))
    return RowKeys(tuple(rows))


@dataclass(frozen=True)
class ChainRows:
    """``RowKeys``'s row-exact attention for a chain on one sequence, written for
    ``torch.compile``: row i of a chunk of c attends to the first ``used - c + i + 1``
    slots by the same one-row SDPA call, its bounds computed from ``used`` inside the
    graph, so one compiled graph serves a chunk size at every cache length."""

    def attend(self, queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """queries [1, heads, chunk, dim]; keys/values [1, kv_heads, used, dim]."""
        chunk, used = queries.shape[2], keys.shape[2]
        rows = [
            F.scaled_dot_product_attention(
                queries[:, :, i : i + 1],
                keys[:, :, : used - chunk + i + 1],
                values[:, :, : used - chunk + i + 1],
                enable_gqa=True,
            )
            for i in range(chunk)
        ]
        return torch.cat(rows, dim=2)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_out = cfg.num_heads * cfg.head_dim
        kv_out = cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=False)
        self.split = (q_out, kv_out, kv_out)
        # q, k and v as one layer (``spectune.models.quant.quantize_net``): one kernel
        # call instead of three on runtimes where a call's overhead counts.
        self.qkv: nn.Module | None = None

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(q, k, v) of ``x`` [..., hidden], each [..., out]."""
        if self.qkv is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        return q, k, v

    def forward(
        self,
        x: Tensor,  # [batch, chunk, hidden]
        cos: Tensor,  # [batch, chunk, head_dim]
        sin: Tensor,
        cache: StaticKVCache | None,
        layer: int,
        slots: Tensor | None,  # [batch, chunk]
        mask: Tensor | None,  # [batch, 1, chunk, used] bool, True = may attend
        used: int,
        rows: RowKeys | ChainRows | None = None,
    ) -> Tensor:
        cfg = self.cfg
        batch, chunk, _ = x.shape
        q, k, v = self.project(x)
        q = q.view(batch, chunk, cfg.num_heads, cfg.head_dim)
        k = k.view(batch, chunk, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(batch, chunk, cfg.num_kv_heads, cfg.head_dim)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if cache is None:  # training / full-sequence scoring
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=True,
            )
        else:
            assert slots is not None
            cache.write(layer, slots, k, v)
            keys, values = cache.view(layer, used)  # [batch, kv_heads, used, head_dim]
            if rows is not None:
                out = rows.attend(q.transpose(1, 2), keys, values)
            else:
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
                )
        projected: Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, chunk, -1))
        return projected


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: nn.Module | None = None  # gate and up as one layer, like ``Attention.qkv``

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        down: Tensor = self.down_proj(F.silu(gate) * up)
        return down


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: StaticKVCache | None,
        layer: int,
        slots: Tensor | None,
        mask: Tensor | None,
        used: int,
        rows: RowKeys | ChainRows | None = None,
    ) -> Tensor:
        attended = self.self_attn(
            self.input_layernorm(x), cos, sin, cache, layer, slots, mask, used, rows
        )
        x = x + attended
        mlp_out: Tensor = self.mlp(self.post_attention_layernorm(x))
        return x + mlp_out


class LlamaTransformer(nn.Module):
    """The network. Parameter names follow transformers' Llama so checkpoints map 1:1."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        tokens: Tensor,  # [batch, chunk]
        positions: Tensor,  # [batch, chunk]
        cache: StaticKVCache | None = None,
        slots: Tensor | None = None,  # [batch, chunk]
        mask: Tensor | None = None,  # [batch, 1, chunk, used]
        used: int = 0,
        capture: tuple[int, ...] = (),
        rows: RowKeys | ChainRows | None = None,
        last_only: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Returns (logits [batch, chunk, vocab], states [batch, chunk, hidden * n]); with
        ``last_only`` the logits of the last position alone ([batch, 1, vocab]).

        The states are the last hidden state after the final norm, or with ``capture`` the
        concatenated outputs of those blocks (the residual stream after block i; the last
        block's is taken after the final norm), which multi-layer draft heads read.
        ``rows``: attend row by row (batch invariance, ``RowKeys``) instead of with ``mask``.
        """
        x = self.embed_tokens(tokens)
        cos, sin = rotary_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        last = len(self.layers) - 1
        # One flag per block, compared with ``==``: under torch.compile(dynamic=True) the
        # layer numbers come in symbolic, and ``in`` on a tuple of symbols never holds.
        wanted = [any(i == layer for layer in capture) for i in range(last + 1)] if capture else []
        captured: list[Tensor] = []
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, cache, i, slots, mask, used, rows)
            if capture and wanted[i] and i != last:
                captured.append(x)
        hidden = self.norm(x)
        logits = self.lm_head(hidden[:, -1:] if last_only else hidden)
        if capture:
            return logits, torch.cat([*captured, hidden] if wanted[last] else captured, dim=-1)
        return logits, hidden


def attention_mask(
    lengths: list[int], chunk: int, slots: Tensor, chunk_mask: Tensor | None
) -> tuple[Tensor | None, int]:
    """Build the [batch, 1, chunk, used] visibility mask (True = may attend).

    Each query sees its sequence's prefix (slots < length) and, inside the chunk, what
    ``chunk_mask`` allows (causal by default; a tree passes ancestor-only visibility).
    Returns (None, used) for the single-token, single-sequence case, where everything
    held is visible and SDPA needs no mask.
    """
    used = max(lengths) + chunk
    if chunk_mask is None and chunk == 1 and len(lengths) == 1:
        return None, used
    device = slots.device  # the cache's, hence the model's
    if chunk_mask is None:
        chunk_mask = torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril()
        chunk_mask = chunk_mask.expand(len(lengths), chunk, chunk)
    starts = torch.tensor(lengths, device=device)[:, None, None]  # [batch, 1, 1]
    mask = torch.arange(used, device=device)[None, None, :] < starts  # prefix: [batch, 1, used]
    mask = mask.expand(len(lengths), chunk, used).clone()
    rows = torch.arange(len(lengths), device=device)[:, None, None]
    queries = torch.arange(chunk, device=device)[None, :, None]
    mask[rows, queries, slots[:, None, :]] = chunk_mask.to(device)
    return mask[:, None], used


class LlamaLM:
    """``LanguageModel`` over a ``LlamaTransformer`` with a ``StaticKVCache``."""

    tree_masks = True  # positions and chunk masks (token trees), see ``attention_mask``

    def __init__(self, net: LlamaTransformer, *, name: str | None = None) -> None:
        self.net = net.eval()
        cfg = net.cfg
        self._info = cfg.model_info(
            name=name or cfg.name, num_parameters=sum(p.numel() for p in net.parameters())
        )
        self.feature_layers: tuple[int, ...] = ()  # () = the last hidden state only
        self._batch_invariant: bool | None = None  # decided at the first forward
        self._compiled_step: Any = None  # ``compile_steps``
        self._compiled_sizes: set[int] = set()  # chunk sizes whose graph is compiled
        # Hears a chunk size just before its first compiled forward (a compile takes
        # seconds to minutes): set by ``compile_steps`` for a caller that shows progress.
        self.on_compile: Callable[[int], None] | None = None

    @property
    def batch_invariant(self) -> bool:
        """Whether short forwards attend row by row, so a position's logits do not depend
        on the rows beside it (module docstring). On by default where the linear layers
        are on the weight-only kernels (int4, int8), the runtimes where that makes
        speculative greedy output equal plain greedy output; set it to measure its cost."""
        if self._batch_invariant is None:
            self._batch_invariant = self.precision in ("int4", "int8")
        return self._batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        self._batch_invariant = on

    @property
    def compiled_steps(self) -> bool:
        """Whether the forwards after the prompt run a compiled network (``compile_steps``)."""
        return self._compiled_step is not None

    def compile_steps(self, on_compile: Callable[[int], None] | None = None) -> None:
        """Run every forward after the prompt through the network compiled by
        ``torch.compile``: one sequence's steps and chains (plain decoding's step, a chain
        draft's verification) of up to ``ROW_EXACT_MAX_ROWS`` tokens, attending row by row
        (``ChainRows``) so a position's logits do not depend on the rows beside it. Shapes
        are dynamic: one graph per chunk size at every cache length, each compiled at its
        first use (about 20 s for one token on a 2-core CPU, minutes for 9: the row loop
        is unrolled; ``compile_chunks`` compiles them ahead). The prompt's forward, on an empty
        cache, stays eager, the same in plain and speculative decoding. A compiled model
        takes no token trees (``tree_masks`` is False, so pairing keeps drafts chains) and
        no batch of sequences: those forwards raise ``InvalidParameterError``, since an
        eager forward among compiled ones could round apart from plain decoding's.
        ``on_compile`` hears each chunk size before its graph compiles."""
        if on_compile is not None:
            self.on_compile = on_compile
        if self._compiled_step is None:
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, ROW_EXACT_MAX_ROWS + 1)
            net = self.net

            def step(
                tokens: Tensor, positions: Tensor, cache: StaticKVCache, slots: Tensor, used: int
            ) -> Any:
                capture = self.feature_layers  # as exposed at the call, not at the compile
                return net(tokens, positions, cache, slots, None, used, capture, ChainRows())

            self._compiled_step = torch.compile(step, dynamic=True)
            self.tree_masks = False

    def compile_chunks(self, largest: int) -> None:
        """Compile the graphs of chunks of 1 .. ``largest`` tokens now (``compile_steps``),
        on a scratch cache, so no timed forward pays a compile."""
        if self._compiled_step is None:
            raise InvalidParameterError("compile_chunks needs compile_steps first")
        for chunk in range(1, largest + 1):
            # A "prompt" of 2 tokens: a cache length of 0 or 1 would give a graph of its own
            # (torch specialises sizes 0 and 1), one no later step could use.
            cache = self.new_cache(1, capacity=chunk + 8)
            self.forward(torch.zeros(1, 2, dtype=torch.long), cache)  # eager
            self.forward(torch.zeros(1, chunk, dtype=torch.long), cache)

    def expose_layers(self, layers: tuple[int, ...]) -> None:
        """Make ``forward``'s ``hidden`` the concatenated states of ``layers`` (ascending),
        for a multi-layer feature head. A model serves one such head at a time."""
        cfg = self.net.cfg
        if list(layers) != sorted(set(layers)) or not all(0 <= i < cfg.num_layers for i in layers):
            raise ValueError(
                f"feature layers must be ascending in [0, {cfg.num_layers}), got {layers}"
            )
        if self.feature_layers and layers and self.feature_layers != layers:
            raise ValueError(
                f"this target already exposes layers {self.feature_layers} to another head"
            )
        self.feature_layers = layers

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def dtype(self) -> torch.dtype:
        return self.net.embed_tokens.weight.dtype

    @property
    def precision(self) -> str:
        """How it runs, as ``--dtype`` names it: int4 or int8 where its linear layers are on
        weight-only kernels (``spectune.models.quant``), else its dtype (fp32, bf16, fp16)."""
        from spectune.models.quant import Int4Linear, Int8Linear

        kinds = {type(module) for module in self.net.modules()}
        if Int4Linear in kinds:
            return "int4"
        if Int8Linear in kinds:
            return "int8"
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")

    @property
    def device(self) -> torch.device:
        """Where forwards run (``spectune.models.devices``: outputs always come back on the CPU)."""
        return self.net.embed_tokens.weight.device

    def new_cache(self, batch_size: int = 1, capacity: int | None = None) -> StaticKVCache:
        cfg = self.net.cfg
        return StaticKVCache(
            num_layers=cfg.num_layers,
            batch_size=batch_size,
            capacity=min(capacity or cfg.max_context, cfg.max_context),
            kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    @torch.inference_mode()
    def forward(
        self,
        tokens: Tensor,  # [batch, chunk]
        cache: Any,
        *,
        positions: Tensor | None = None,  # [batch, chunk]
        chunk_mask: Tensor | None = None,  # [batch, chunk, chunk] bool
        last_only: bool = False,
    ) -> ModelOutput:
        if not isinstance(cache, StaticKVCache):
            raise TypeError("LlamaLM decodes against the StaticKVCache it created")
        chunk = tokens.shape[1]
        if max(cache.lengths) + chunk > cache.capacity:
            raise PromptError(
                f"sequence would reach {max(cache.lengths) + chunk} tokens, over the "
                f"context of {cache.capacity}"
            )
        device = self.device
        slots = cache.slots(chunk)  # on the cache's device
        if self._compiled_step is not None and any(cache.lengths):  # after the prompt
            out = self._compiled_forward(tokens, cache, slots, positions, chunk_mask)
            return ModelOutput(out.logits[:, -1:], out.hidden) if last_only else out
        rows: RowKeys | None = None
        # One token of one sequence already makes the one-row SDPA call (mask None).
        several = chunk > 1 or len(cache.lengths) > 1 or chunk_mask is not None
        if self.batch_invariant and several and chunk <= ROW_EXACT_MAX_ROWS:
            rows = row_keys(cache.lengths, chunk, chunk_mask)
            mask, used = None, max(cache.lengths) + chunk
        else:
            mask, used = attention_mask(cache.lengths, chunk, slots, chunk_mask)
        logits, hidden = self.net(
            tokens.to(device),
            slots if positions is None else positions.to(device),
            cache,
            slots,
            mask,
            used,
            self.feature_layers,
            rows,
            last_only,
        )
        cache.advance(chunk)
        # ``to`` is free on the CPU; from a GPU it brings the step's outputs to the decode loop.
        return ModelOutput(logits=logits.to("cpu"), hidden=hidden.to("cpu"))

    def _compiled_forward(
        self,
        tokens: Tensor,
        cache: StaticKVCache,
        slots: Tensor,
        positions: Tensor | None,
        chunk_mask: Tensor | None,
    ) -> ModelOutput:
        """``forward`` after the prompt on a compiled model (``compile_steps``)."""
        chunk = tokens.shape[1]
        if chunk_mask is not None or cache.batch_size > 1 or chunk > ROW_EXACT_MAX_ROWS:
            raise InvalidParameterError(
                "a model with compiled steps decodes one sequence by chains of at most "
                f"{ROW_EXACT_MAX_ROWS} tokens (no token trees, no batches); got "
                f"{cache.batch_size} sequence(s), {chunk} tokens"
                + (", a tree mask" if chunk_mask is not None else "")
            )
        device = self.device
        used = cache.lengths[0] + chunk
        # Fresh contiguous copies: a slice of a longer chunk (a group of a chunked chain)
        # keeps its parent's strides, and the graphs guard on strides, so it would compile
        # a graph of its own (minutes, inside a timed step).
        tokens = tokens.to(device).clone(memory_format=torch.contiguous_format)
        if positions is None:
            positions = slots
        else:
            positions = positions.to(device).clone(memory_format=torch.contiguous_format)
        if chunk not in self._compiled_sizes:
            self._compiled_sizes.add(chunk)
            if self.on_compile is not None:
                self.on_compile(chunk)
        logits, hidden = self._compiled_step(tokens, positions, cache, slots, used)
        cache.advance(chunk)
        return ModelOutput(logits=logits.to("cpu"), hidden=hidden.to("cpu"))


def truncated(model: LlamaLM, num_layers: int) -> LlamaLM:
    """The model's first ``num_layers`` blocks under its own embedding, norm and head.

    The classic zero-training draft (a "layer-skip" draft): same tokenizer, same family,
    ``num_layers / total`` of the blocks' cost. Weights are shared, not copied.
    """
    cfg = model.net.cfg
    if not 1 <= num_layers <= cfg.num_layers:
        raise ValueError(f"num_layers must be in [1, {cfg.num_layers}], got {num_layers}")
    small_cfg = dataclasses.replace(
        cfg, num_layers=num_layers, name=f"{cfg.name}-first{num_layers}"
    )
    with torch.device("meta"):
        net = LlamaTransformer(small_cfg)
    net.embed_tokens = model.net.embed_tokens
    net.layers = nn.ModuleList(model.net.layers[:num_layers])
    net.norm = model.net.norm
    net.lm_head = model.net.lm_head
    return LlamaLM(net, name=small_cfg.name)
