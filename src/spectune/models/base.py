"""The model contract the engine is written against.

A ``LanguageModel`` knows nothing about text: it maps token ids at positions to logits,
appending keys and values to a cache it created. Tokenization lives in
``spectune.models.tokenizer``; sampling in ``spectune.sampling``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

__all__ = ["KVCache", "LanguageModel", "ModelInfo", "ModelOutput", "takes_tree_masks"]


@dataclass(frozen=True)
class ModelInfo:
    """What a model is, as far as pairing and decoding need to know."""

    name: str
    family: str  # "llama", "gemma3", ... (config.model_type)
    vocab_size: int  # rows of the output layer
    max_context: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    num_parameters: int
    hidden_size: int


@dataclass(frozen=True)
class ModelOutput:
    logits: Tensor  # [batch, chunk, vocab]
    hidden: Tensor | None  # [batch, chunk, hidden] last hidden state, when the model exposes it


@runtime_checkable
class KVCache(Protocol):
    """Per-sequence key/value store.

    Invariant: for sequence b, slots at or past ``lengths[b]`` are never read, so
    rolling back after a rejection is just lowering the length (``truncate``).
    """

    @property
    def batch_size(self) -> int: ...

    @property
    def capacity(self) -> int:
        """Most tokens one sequence can hold."""
        ...

    def length(self, row: int = 0) -> int:
        """Tokens currently held for sequence ``row``."""
        ...

    def truncate(self, length: int, row: int = 0) -> None:
        """Forget everything at or past ``length`` for sequence ``row`` (rollback)."""
        ...

    def move_slots(self, row: int, src: Tensor, dst_start: int) -> None:
        """Copy the entries of slots ``src`` ([n] int64) of sequence ``row`` to slots
        ``dst_start .. dst_start + n - 1`` (a tree's accepted path compacted in place)."""
        ...


@runtime_checkable
class LanguageModel(Protocol):
    """A causal LM that decodes against a cache it created.

    ``forward`` appends ``tokens`` after each sequence's current cache length and
    advances it by the chunk length. ``positions`` (rotary positions) default to the
    cache slots; trees pass depth-based positions plus ``chunk_mask``, which says which
    tokens of the chunk each chunk token may see (the prefix is always visible).
    ``last_only``: logits of each row's last position alone ([batch, 1, vocab]; ``hidden``
    stays whole), for a prompt's prefill, whose other logits nobody reads: the native and
    transformers runtimes then skip the output head's other rows (on the default int4
    model about a tenth of a prefill's time).
    """

    @property
    def tree_masks(self) -> bool:
        """Whether ``forward`` honours ``positions`` and ``chunk_mask`` (token trees) and its
        caches can compact a path: the native runtime always, the transformers adapter for
        full-attention models (see ``spectune.models.hf``)."""
        ...

    @property
    def info(self) -> ModelInfo: ...

    def new_cache(self, batch_size: int = 1, capacity: int | None = None) -> KVCache: ...

    def forward(
        self,
        tokens: Tensor,  # [batch, chunk] int64
        cache: KVCache,
        *,
        positions: Tensor | None = None,  # [batch, chunk] int64, default: slot index
        chunk_mask: Tensor | None = None,  # [batch, chunk, chunk] bool, default: causal
        last_only: bool = False,
    ) -> ModelOutput: ...


def takes_tree_masks(model: LanguageModel) -> bool:
    """Whether ``model.forward`` honours ``positions`` and ``chunk_mask`` (token trees) and
    its caches can compact a path (``LanguageModel.tree_masks``)."""
    return model.tree_masks
