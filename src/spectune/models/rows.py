"""Rows of a batched KV cache as caches of their own, and forwards over some of its rows.

The batched engine (``spectune.decode.batch``) and the batched drafters
(``spectune.drafters.model``, ``spectune.drafters.feature``) forward the active
rows, one joining row, or ragged chunks padded per row through these. A cache that can do
this is a ``RowsCache``: the native runtime's ``StaticKVCache`` and llama.cpp's
``LlamaCppCache``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar, runtime_checkable

from torch import Tensor

from spectune.models.base import KVCache, LanguageModel, ModelOutput

__all__ = ["RowsCache", "forward_row", "forward_rows", "ragged_forward", "row_view"]

T = TypeVar("T")


@runtime_checkable
class RowsCache(KVCache, Protocol):
    """A cache of several sequences whose rows can be used on their own and moved."""

    lengths: list[int]  # tokens held per row

    def rows(self, start: int, stop: int) -> RowsCache:
        """Rows ``[start, stop)`` as a cache sharing this one's storage; its ``lengths`` are
        a copy the caller writes back."""
        ...

    def copy_row(self, src: int, dst: int) -> None:
        """Make row ``dst`` hold what row ``src`` holds."""
        ...


@contextmanager
def row_view(cache: KVCache, start: int, stop: int) -> Iterator[KVCache]:
    """Rows ``[start, stop)`` of ``cache`` as a cache of their own, their lengths written back
    on exit. The whole cache is itself (a cache that is not a ``RowsCache`` holds one
    sequence and can only be used whole)."""
    if start == 0 and stop == cache.batch_size:
        yield cache
        return
    if not isinstance(cache, RowsCache):
        raise TypeError("row views need a cache of several rows (RowsCache)")
    view = cache.rows(start, stop)
    try:
        yield view
    finally:
        cache.lengths[start:stop] = view.lengths


def forward_rows(
    model: LanguageModel,
    cache: KVCache,
    num_rows: int,
    tokens: Tensor,  # [num_rows, chunk] int64
    positions: Tensor | None = None,  # [num_rows, chunk] int64
    chunk_mask: Tensor | None = None,  # [num_rows, chunk, chunk] bool
) -> ModelOutput:
    """Forward the leading ``num_rows`` rows of ``cache`` only (the active sequences)."""
    with row_view(cache, 0, num_rows) as view:
        return model.forward(tokens, view, positions=positions, chunk_mask=chunk_mask)


def forward_row(
    model: LanguageModel,
    cache: KVCache,
    row: int,
    tokens: Tensor,  # [1, chunk] int64
) -> ModelOutput:
    """Forward one row of ``cache``: a prefill for a sequence joining the batch, so the
    logits are its last position's alone (``LanguageModel.forward``'s ``last_only``)."""
    with row_view(cache, row, row + 1) as view:
        return model.forward(tokens, view, last_only=True)


def ragged_forward(
    cache: KVCache, num_rows: int, used: Sequence[int], forward: Callable[[KVCache], T]
) -> T:
    """Run ``forward`` over the leading ``num_rows`` rows, each given a padded chunk of which
    only ``used[row]`` tokens are real, then truncate every row back to its length before
    plus ``used[row]``: the padding is forgotten (causal attention kept the real tokens
    blind to it, since it comes after them)."""
    before = [cache.length(row) for row in range(num_rows)]
    with row_view(cache, 0, num_rows) as view:
        out = forward(view)
    for row in range(num_rows):
        cache.truncate(before[row] + used[row], row)
    return out
