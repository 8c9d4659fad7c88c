"""Preallocated, position-indexed key/value cache for the native runtime.

Layout per layer: keys and values as ``[batch, kv_heads, capacity, head_dim]``, plus one
integer length per sequence. Appending writes into slots ``[length, length + chunk)``;
rollback after a rejection moves the integer (O(1), nothing is copied or freed).

Invariant: slots at or past ``lengths[b]`` are never read. Attention masks them out,
so stale entries left by a rollback are harmless and are overwritten by the next append.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["StaticKVCache"]


class StaticKVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        batch_size: int,
        capacity: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (batch_size, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = [0] * batch_size  # host-side ints: the hot path never syncs on them
        self._capacity = capacity

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self._capacity

    def length(self, row: int = 0) -> int:
        return self.lengths[row]

    def truncate(self, length: int, row: int = 0) -> None:
        """Roll sequence ``row`` back to ``length`` tokens. Never grows a sequence."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot truncate row {row} of length {self.lengths[row]} to {length}")
        self.lengths[row] = length

    def reset(self, row: int | None = None) -> None:
        """Empty one sequence (or all): the row can then hold a new request."""
        rows = range(self.batch_size) if row is None else (row,)
        for r in rows:
            self.lengths[r] = 0

    def slots(self, chunk: int) -> Tensor:
        """Slots the next ``chunk`` tokens go to: [batch, chunk] int64."""
        device = self.keys[0].device
        starts = torch.tensor(self.lengths, dtype=torch.long, device=device)
        return starts[:, None] + torch.arange(chunk, device=device)[None, :]

    def view(self, layer: int, used: int) -> tuple[Tensor, Tensor]:
        """Keys and values of the first ``used`` slots: 2 x [batch, kv_heads, used, head_dim]."""
        return self.keys[layer][:, :, :used], self.values[layer][:, :, :used]

    def write(self, layer: int, slots: Tensor, keys: Tensor, values: Tensor) -> None:
        """Store a chunk. slots: [batch, chunk]; keys/values: [batch, chunk, kv_heads, head_dim]."""
        if self.batch_size == 1:
            # Fast path for the common single-sequence case: a contiguous slice copy.
            start = self.lengths[0]
            end = start + keys.shape[1]
            self.keys[layer][:, :, start:end] = keys.transpose(1, 2)
            self.values[layer][:, :, start:end] = values.transpose(1, 2)
            return
        rows = torch.arange(self.batch_size, device=slots.device)[:, None]  # [batch, 1]
        # Advanced indices around a slice put the indexed dims first: [batch, chunk, kv, dim].
        self.keys[layer][rows, :, slots] = keys
        self.values[layer][rows, :, slots] = values

    def advance(self, chunk: int) -> None:
        """Count a written chunk as held (after every layer wrote it)."""
        self.lengths = [n + chunk for n in self.lengths]

    def move_slots(self, row: int, src: Tensor, dst_start: int) -> None:
        """Copy slots ``src`` ([n] int64) of ``row`` to ``[dst_start, dst_start + n)``.

        Used to compact a tree's accepted path into the contiguous prefix; the caller
        then truncates to ``dst_start + n``.
        """
        dst = slice(dst_start, dst_start + src.numel())
        src = src.to(self.keys[0].device)
        for layer in range(len(self.keys)):
            self.keys[layer][row, :, dst] = self.keys[layer][row, :, src].clone()
            self.values[layer][row, :, dst] = self.values[layer][row, :, src].clone()

    def rows(self, start: int, stop: int) -> StaticKVCache:
        """A cache over rows ``[start, stop)`` that shares this cache's key/value storage.

        Used by batched decoding to run a forward over the active rows only. Writes through
        the view land in this cache; the view's ``lengths`` are a copy, so the caller
        writes them back (``cache.lengths[start:stop] = view.lengths``) when done.
        """
        if not 0 <= start < stop <= self.batch_size:
            raise ValueError(f"rows [{start}, {stop}) outside a batch of {self.batch_size}")
        view = StaticKVCache.__new__(StaticKVCache)
        view.keys = [k[start:stop] for k in self.keys]  # slicing dim 0 is a view, not a copy
        view.values = [v[start:stop] for v in self.values]
        view.lengths = self.lengths[start:stop]
        view._capacity = self._capacity
        return view

    def copy_row(self, src: int, dst: int) -> None:
        """Make row ``dst`` hold what row ``src`` holds (slots below its length, and the
        length). Batched decoding uses it to keep active sequences in the leading rows."""
        used = self.lengths[src]
        for layer in range(len(self.keys)):
            self.keys[layer][dst, :, :used] = self.keys[layer][src, :, :used]
            self.values[layer][dst, :, :used] = self.values[layer][src, :, :used]
        self.lengths[dst] = used
