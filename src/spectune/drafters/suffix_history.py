"""A server's memory of its earlier outputs, for suffix drafting (bounded, oldest out).

Every request's suffix drafter looks its context's tail up here on every step, so the
lookup must not grow with the store: a scan of a full store (262,144 tokens) costs about
0.1 ms and re-joining it after each finished request a few ms. The store is therefore
searched in two parts:

- a ``SuffixIndex`` over the outputs held at the last re-index (a binary search, cost
  independent of size), whose matches skip outputs evicted or replaced since (a tail
  seen only in those falls back to its longest shorter suffix still held);
- a scan over the outputs added since, a short stream.

It re-indexes when the part added since exceeds a quarter of the indexed part or
``REINDEX_MAX_SCAN`` tokens, or the part evicted since exceeds a quarter (and either at
least ``REINDEX_MIN_TOKENS``): each re-index costs about 0.3 us per token held (76 ms for a
full store), so filing an output costs about 5 us per token on average (a token takes
10-50 ms to generate), and no lookup scans more than 16k tokens. Where both parts match
the tail equally far, the part where it occurred more often continues it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from spectune.drafters import suffix_kernels
from spectune.drafters.names import DEFAULT_MAX_DEPTH
from spectune.drafters.suffix_index import (
    MAX_OCCURRENCES,
    Document,
    Match,
    SuffixIndex,
    TokenArray,
    join_documents,
    scan_matches,
    thin,
)
from spectune.errors import InvalidParameterError

__all__ = ["REINDEX_MAX_SCAN", "REINDEX_MIN_TOKENS", "HistoryStore", "TenantHistories"]

REINDEX_MIN_TOKENS = 4096  # below this the newest outputs are only scanned
REINDEX_MAX_SCAN = 16_384  # the newest outputs scanned on a lookup, at most


class _Indexed:
    """The indexed part: the index, each output's key and place in its stream, and which
    stream positions belong to outputs still held."""

    def __init__(self, docs: OrderedDict[int, TokenArray], max_depth: int) -> None:
        arrays = list(docs.values())
        self.index = SuffixIndex.build(
            arrays,
            vocab_size=int(np.iinfo(np.int32).max),  # ids were checked when they were drafted
            tokenizer="",
            target="server history",
            max_depth=max_depth,
        )
        lengths = [len(a) for a in arrays]
        # join_documents: max_depth SEPs, then each output followed by one SEP
        starts = max_depth + np.concatenate(([0], np.cumsum(np.add(lengths, 1))[:-1]))
        self.place = {key: (int(s), n) for key, s, n in zip(docs, starts, lengths, strict=True)}
        self.live = np.ones(len(self.index.tokens), dtype=bool)  # [stream] held positions
        self.all_live = True
        self.tokens = int(sum(lengths))

    def drop(self, key: int) -> int:
        """Mark an output as gone; the number of its tokens (0 if it is not indexed here)."""
        place = self.place.pop(key, None)
        if place is None:
            return 0
        start, length = place
        self.live[start : start + length] = False
        self.all_live = False
        return length

    def chain(
        self, tail: TokenArray, caps: npt.NDArray[np.int64], min_prob: float
    ) -> suffix_kernels.Chain:
        """``find`` then ``continuation`` in one compiled call (``SuffixIndex.chain``)."""
        return self.index.chain(tail, caps, min_prob, None if self.all_live else self.live)

    def find(self, tail: Document) -> Match | None:
        """The longest suffix of ``tail`` with an occurrence in an output still held."""
        for length, ends in self.index.matches(tail):
            if not self.all_live:  # skip outputs evicted or replaced since
                ends = ends[self.live[ends]]
            if ends.size:
                return Match(length, thin(ends), self.index.tokens)
        return None


class HistoryStore:
    """Outputs of earlier requests, for a server: bounded by ``max_tokens``, oldest first out.

    Shared by every request's drafter (one per server). ``add`` files a finished output
    under a key (re-adding a key replaces it); ``find`` gives the longest match of a tail
    (module docstring: an index plus a scan of the newest outputs). A lock guards both:
    outputs are filed from whichever thread drops a request's drafter, while another may
    be drafting. ``on_add`` is called after each filing, outside the lock (``TenantHistories``
    bounds several stores together with it).
    """

    def __init__(
        self,
        max_tokens: int = 262_144,
        max_depth: int = DEFAULT_MAX_DEPTH,
        on_add: Callable[[HistoryStore], None] | None = None,
    ) -> None:
        if max_tokens < 1 or max_depth < 1:
            raise InvalidParameterError(
                f"max_tokens and max_depth must be >= 1, got {max_tokens} and {max_depth}"
            )
        self.max_tokens = max_tokens
        self.max_depth = max_depth
        self._docs: OrderedDict[int, TokenArray] = OrderedDict()
        self._size = 0
        self._indexed: _Indexed | None = None
        self._dropped = 0  # tokens of indexed outputs gone since the last re-index
        self._recent: OrderedDict[int, TokenArray] = OrderedDict()  # not indexed yet
        self._recent_size = 0
        self._recent_stream: TokenArray | None = None  # joined lazily
        self.added = 0  # documents ever added (evicted ones included)
        self.reindexed = 0  # re-indexes so far
        self.on_add = on_add
        self._lock = threading.Lock()

    def add(self, key: int, output: Document) -> None:
        with self._lock:
            self._remove(key)
            doc = np.asarray(output, dtype=np.int32)[-self.max_tokens :]
            if doc.size == 0:
                return
            self._docs[key] = self._recent[key] = doc
            self._size += len(doc)
            self._recent_size += len(doc)
            self._recent_stream = None
            self.added += 1
            while self._size > self.max_tokens:
                self._remove(next(iter(self._docs)))
        if self.on_add is not None:
            self.on_add(self)

    def clear(self) -> None:
        """Forget every output (the index too)."""
        with self._lock:
            self._docs.clear()
            self._recent.clear()
            self._size = self._recent_size = self._dropped = 0
            self._indexed = None
            self._recent_stream = None

    def _remove(self, key: int) -> None:
        doc = self._docs.pop(key, None)
        if doc is None:
            return
        self._size -= len(doc)
        if self._recent.pop(key, None) is not None:
            self._recent_size -= len(doc)
            self._recent_stream = None
        elif self._indexed is not None:
            self._dropped += self._indexed.drop(key)

    def __len__(self) -> int:
        return len(self._docs)

    @property
    def num_tokens(self) -> int:
        return self._size

    def documents(self) -> list[TokenArray]:
        with self._lock:
            return list(self._docs.values())

    def find(self, tail: Document, max_depth: int) -> Match | None:
        """The longest suffix of ``tail`` (at most ``max_depth`` tokens, and at most the
        store's own ``max_depth``) among the outputs held."""
        depth = min(max_depth, self.max_depth)
        indexed, recent = self._parts()
        old = None if indexed is None else indexed.find(tail[-depth:])
        new = None if recent is None else scan_matches(recent, tail, depth)
        if old is None or new is None:
            return old or new
        return max(new, old, key=lambda m: (m.length, m.ends.size))

    def chain(
        self, tail: TokenArray, max_depth: int, caps: npt.NDArray[np.int64], min_prob: float
    ) -> suffix_kernels.Chain | None:
        """``find`` then ``continuation`` (``caps``: tokens allowed per matched length), in
        one compiled call per part; the same match ``find`` picks. None: no match."""
        depth = min(max_depth, self.max_depth)
        indexed, recent = self._parts()
        old = None if indexed is None else indexed.chain(tail[-depth:], caps, min_prob)
        new = (
            None
            if recent is None
            else suffix_kernels.scan_chain(
                recent, tail, depth, len(recent) - 1, caps, min_prob, MAX_OCCURRENCES
            )
        )
        found = [chain for chain in (new, old) if chain is not None and chain[0] > 0]
        # as in find: the longer match, then the one seen more often, then the newer part
        return max(found, key=lambda c: (c[0], c[3])) if found else None

    def _parts(self) -> tuple[_Indexed | None, TokenArray | None]:
        """The indexed part and the newest outputs' stream, after any re-index due."""
        with self._lock:
            if not self._docs:
                return None, None
            self._maybe_reindex()
            if self._recent_stream is None and self._recent:
                self._recent_stream = join_documents(self._recent.values(), front_pad=1)
            # Both are replaced on change; only the index's live mask changes in place, and
            # only by losing positions (a lookup racing an eviction may still count it).
            return self._indexed, self._recent_stream

    def _maybe_reindex(self) -> None:
        indexed_size = 0 if self._indexed is None else self._indexed.tokens
        quarter = max(REINDEX_MIN_TOKENS, indexed_size // 4)
        scan_limit = max(REINDEX_MIN_TOKENS, min(indexed_size // 4, REINDEX_MAX_SCAN))
        if self._recent_size <= scan_limit and self._dropped <= quarter:
            return
        self._indexed = _Indexed(self._docs, self.max_depth)
        self._dropped = 0
        self._recent.clear()
        self._recent_size = 0
        self._recent_stream = None
        self.reindexed += 1


class TenantHistories:
    """One ``HistoryStore`` per tenant (a server's API-key holder), all under one bound.

    A request drafts only from its own tenant's store, so nothing one tenant's requests
    produced can shape another's drafts, acceptance or latency. The stores share
    ``max_tokens`` in total: when a filing takes the total past it, the stores of the
    tenants least recently served go whole (oldest tenant out); a tenant alone past it
    loses its own oldest outputs (each store's own bound is the total).
    """

    def __init__(self, max_tokens: int = 262_144, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        if max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.max_depth = max_depth
        self._stores: OrderedDict[str, HistoryStore] = OrderedDict()  # least recent first
        self.evicted = 0  # tenants' stores dropped to keep the bound
        self._lock = threading.Lock()

    def store(self, tenant: str) -> HistoryStore:
        """``tenant``'s store (a new, empty one for a tenant not held), now the most recent."""
        with self._lock:
            store = self._stores.get(tenant)
            if store is None:
                store = HistoryStore(self.max_tokens, self.max_depth, on_add=self._filed)
                self._stores[tenant] = store
            self._stores.move_to_end(tenant)
            return store

    def _filed(self, store: HistoryStore) -> None:
        dropped: list[HistoryStore] = []
        with self._lock:
            for tenant, held in self._stores.items():
                if held is store:  # filing counts as being served
                    self._stores.move_to_end(tenant)
                    break
            total = sum(held.num_tokens for held in self._stores.values())
            while total > self.max_tokens and len(self._stores) > 1:
                # the filer's store is the most recent: the oldest tenant is another
                tenant, held = next(iter(self._stores.items()))
                del self._stores[tenant]
                total -= held.num_tokens
                dropped.append(held)
                self.evicted += 1
        for held in dropped:  # a request still drafting from one keeps a harmless empty store
            held.clear()

    def tenants(self) -> list[str]:
        """The tenants held, least recently served first."""
        with self._lock:
            return list(self._stores)

    def __len__(self) -> int:
        return len(self._stores)

    @property
    def num_tokens(self) -> int:
        with self._lock:
            return sum(held.num_tokens for held in self._stores.values())
