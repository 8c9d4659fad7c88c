"""Token indexes for suffix drafting: where did the context's tail occur, and what followed.

Three sources answer the same question, "the longest tail of the context seen before, and
every place it ended" (a ``Match``):

- ``SuffixIndex``: a static corpus (the target's own earlier answers), as a suffix array
  over the *reversed* token stream. Reading the corpus backwards from a position is reading
  a reversed suffix forwards, so the ranges of occurrences of the context's last 1, 2, 3, ...
  tokens are nested: each longer tail is a binary search inside the previous range. The
  array is sorted only ``max_depth`` tokens deep (matches are capped there), by prefix
  doubling in numpy. Memory: the tokens plus one int32 position per token.
- ``scan_matches``: the same answer by a scan, for the small sources that change every
  step (this request's prompt and output) and the newest part of a server's history
  (``spectune.drafters.suffix_history``).

All sources store documents concatenated with ``SEP`` (-1) between them (and at both
ends), so no match or continuation crosses a document boundary: a query never contains SEP.
``continuation`` walks from a match to its most frequent continuation, ``continuation_tree``
grows a small tree of its most frequent continuations; both are shared by all sources.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from numpy.lib.npyio import NpzFile

from spectune.drafters import suffix_kernels
from spectune.drafters.names import DEFAULT_MAX_DEPTH
from spectune.errors import IncompatibleModelsError, InvalidParameterError, ModelLoadError

__all__ = [
    "INDEX_FORMAT",
    "SEP",
    "Match",
    "SuffixIndex",
    "Document",
    "breadth_first",
    "ContinuationTree",
    "continuation",
    "continuation_tree",
    "join_documents",
    "scan_matches",
    "thin",
    "tokenizer_fingerprint",
]

SEP = -1  # document separator; never a token id
INDEX_FORMAT = "spectune-suffix-index"
INDEX_VERSION = 1
# A match keeps at most this many occurrences, evenly spaced over all of them: the
# continuation's frequencies are estimated from a sample of very common tails (bounded cost).
MAX_OCCURRENCES = 512

IntArray = npt.NDArray[np.int64]
TokenArray = npt.NDArray[np.int32]
Document = Sequence[int] | npt.NDArray[np.integer]  # one text's token ids


@dataclass(frozen=True)
class Match:
    """The longest tail of a context found in one source, and where it occurred.

    ``tokens[e]`` is the last token of each occurrence ``e`` in ``ends``; what followed it
    starts at ``tokens[e + 1]`` (SEP where its document ended).
    """

    length: int  # tokens of the context's tail matched (>= 1)
    ends: IntArray  # [occurrences] indices into ``tokens``
    tokens: TokenArray  # [n] the source's SEP-separated token stream


def join_documents(documents: Iterable[Document], front_pad: int) -> TokenArray:
    """Documents as one SEP-separated stream: ``front_pad`` SEPs, doc, SEP, doc, ..., SEP."""
    parts: list[npt.NDArray[np.int32]] = [np.full(max(front_pad, 1), SEP, dtype=np.int32)]
    sep = np.full(1, SEP, dtype=np.int32)
    for doc in documents:
        array = np.asarray(doc, dtype=np.int64)
        if array.size == 0:
            continue
        if array.ndim != 1 or int(array.min()) < 0 or int(array.max()) > np.iinfo(np.int32).max:
            raise InvalidParameterError("documents must be sequences of non-negative token ids")
        parts.extend((array.astype(np.int32), sep))
    return np.concatenate(parts)


def scan_matches(
    tokens: TokenArray, tail: Document, max_depth: int, limit: int | None = None
) -> Match | None:
    """The longest suffix of ``tail`` (at most ``max_depth`` tokens) that occurs in
    ``tokens`` with a token (not SEP) after it, by a scan. ``limit``: only occurrences
    ending before this index count (the stream's own tail is not a match of itself)."""
    if len(tail) == 0:
        return None
    stop = len(tokens) - 1 if limit is None else limit
    length, ends = suffix_kernels.scan(tokens, _as_tail(tail), max_depth, stop)
    return Match(length, thin(ends), tokens) if length else None


def _as_tail(tail: Document) -> TokenArray:
    """A context's tail as the kernels take it (int32, contiguous; no copy if it is one)."""
    return np.ascontiguousarray(tail, dtype=np.int32)


def thin(ends: npt.NDArray[np.integer]) -> IntArray:
    """At most MAX_OCCURRENCES of ``ends``, evenly spaced, as int64."""
    return suffix_kernels.thin(ends.astype(np.int64, copy=False), MAX_OCCURRENCES)


def continuation(match: Match, max_tokens: int, min_prob: float) -> tuple[list[int], list[float]]:
    """The most frequent continuation of ``match``, token by token, with the corpus estimate
    of each prefix's probability: ``probs[j]`` = (occurrences continuing with tokens[:j+1])
    / (all occurrences). Stops at ``max_tokens``, where every occurrence's document ended,
    or before ``probs`` would fall below ``min_prob``. Ties go to the smaller token id."""
    return suffix_kernels.chain(match.tokens, match.ends, max_tokens, min_prob)


@dataclass(frozen=True)
class ContinuationTree:
    """The most frequent continuations of a match as a token tree, listed parents first
    (breadth first, siblings together, most frequent first); ``parents[i]`` is node i's
    parent (-1: a child of the matched tail), ``probs[i]`` the corpus probability of the
    path from the root to node i."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]


def continuation_tree(
    match: Match, max_depth: int, min_prob: float, width: int, max_nodes: int
) -> ContinuationTree:
    """The ``max_nodes`` most probable continuations of ``match`` as a tree, best first.

    A node's children are the ``width`` tokens that most often follow its path (ties: the
    smaller id), each kept only if its path probability, (occurrences continuing with the
    path) / (all occurrences) as in ``continuation``, reaches ``min_prob``, and only down
    to ``max_depth``. Candidates enter the tree in order of path probability (ties: the
    one found first) until ``max_nodes`` are in. A path's probability never exceeds its
    parent's, so a node's parent is always in before it. With ``width == 1`` this is
    ``continuation``'s chain."""
    total = match.ends.size
    stream = match.tokens
    serial = itertools.count()  # heap tie-break: the candidate found first
    # (-path prob, serial, parent node, token, parent's occurrence ends, depth)
    heap: list[tuple[float, int, int, int, IntArray, int]] = []

    def offer_children(node: int, ends: IntArray, depth: int) -> None:
        if depth >= max_depth:
            return
        following = stream[ends + depth + 1]  # in bounds: every document ends with SEP
        following = following[following >= 0]
        if following.size == 0:
            return
        values, counts = np.unique(following, return_counts=True)
        for i in np.lexsort((values, -counts))[:width]:  # most frequent, then smaller id
            prob = int(counts[i]) / total
            if prob < min_prob:
                break
            heapq.heappush(heap, (-prob, next(serial), node, int(values[i]), ends, depth + 1))

    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    offer_children(-1, match.ends, 0)
    while heap and len(tokens) < max_nodes:
        neg_prob, _, parent, token, ends, depth = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg_prob)
        offer_children(node, ends[stream[ends + depth] == token], depth)
    order, new_parents = breadth_first(parents)
    return ContinuationTree([tokens[n] for n in order], new_parents, [probs[n] for n in order])


def breadth_first(parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """A tree (listed parents first) renumbered breadth first, siblings together in their
    listed order: (``order``: old node index of each new node, the new ``parents``)."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    order: list[int] = []
    new_index = {-1: -1}
    queue = list(children[0])
    for node in queue:  # grows while iterated: a breadth-first walk
        new_index[node] = len(order)
        order.append(node)
        queue.extend(children[node + 1])
    return order, [new_index[parents[n]] for n in order]


def tokenizer_fingerprint(token_strings: Sequence[str]) -> str:
    """A short hash of the whole vocabulary (id -> string): indexes built with one tokenizer
    are rejected by targets with another."""
    digest = hashlib.sha256("\x00".join(token_strings).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


def _reversed_order(reversed_tokens: TokenArray, depth: int) -> IntArray:
    """Start positions of ``reversed_tokens``' suffixes sorted by their first ``depth``
    tokens (prefix doubling: after the round with span h, ranks order the first 2h)."""
    size = len(reversed_tokens)
    rank = (reversed_tokens.astype(np.int64) + 1).copy()  # SEP -> 0, the smallest
    span = 1
    while span < depth:
        shifted = np.zeros(size, dtype=np.int64)
        shifted[: size - span] = rank[span:]
        keys = rank * (int(rank.max()) + 1) + shifted
        _, rank = np.unique(keys, return_inverse=True)
        rank = rank.astype(np.int64)
        span *= 2
    return np.argsort(rank, kind="stable")


@dataclass(frozen=True)
class IndexHeader:
    """What an index file says about itself; ``vocab_size`` and ``tokenizer`` must match
    the target's."""

    vocab_size: int
    tokenizer: str  # tokenizer_fingerprint of the vocabulary the corpus was tokenized with
    target: str  # the model whose answers were indexed (informative)
    documents: int
    tokens: int  # corpus tokens, separators excluded
    max_depth: int
    source: str  # where the corpus came from (informative)

    def to_json(self) -> str:
        return json.dumps({"format": INDEX_FORMAT, "version": INDEX_VERSION, **vars(self)})

    def serves(self, vocab_size: int, fingerprint: str) -> bool:
        """Whether the index was built with this vocabulary (size and fingerprint)."""
        return self.vocab_size == vocab_size and self.tokenizer == fingerprint


def _header(path: Path, data: NpzFile) -> IndexHeader:
    """The validated header of an opened index file (its arrays are read lazily)."""
    raw = json.loads(bytes(data["header"]).decode())
    if raw.get("format") != INDEX_FORMAT or raw.get("version") != INDEX_VERSION:
        raise ModelLoadError(f"{path} is not a version {INDEX_VERSION} suffix index")
    fields = {k: raw[k] for k in IndexHeader.__dataclass_fields__ if k in raw}
    try:
        return IndexHeader(**fields)
    except TypeError as exc:
        raise ModelLoadError(f"suffix index {path}: incomplete header") from exc


class SuffixIndex:
    """A static corpus index: the longest tail of a context in the corpus, in O(depth log n).

    ``tokens``: the SEP-separated stream, padded in front with ``max_depth`` SEPs so that
    reading backwards never leaves the array. ``order``: every position ``e`` holding a
    token with a token after it (nothing else can be continued), sorted by the tokens
    read backwards from it (``tokens[e], tokens[e-1], ...``), to ``max_depth`` tokens.
    """

    def __init__(self, tokens: TokenArray, order: TokenArray, header: IndexHeader) -> None:
        self.tokens = tokens
        self.order = order
        self.header = header
        self.max_depth = header.max_depth
        # [max id + 2] order[first[t]:first[t + 1]] holds token t's occurrences: the first
        # step of every lookup is a table read, not a binary search
        heads = tokens[order]
        self.first = np.searchsorted(heads, np.arange(int(heads.max(initial=-1)) + 2))

    @classmethod
    def build(
        cls,
        documents: Iterable[Document],
        *,
        vocab_size: int,
        tokenizer: str,
        target: str = "",
        source: str = "",
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> SuffixIndex:
        if max_depth < 1:
            raise InvalidParameterError(f"max_depth must be >= 1, got {max_depth}")
        docs = [doc for doc in documents if len(doc) > 0]
        tokens = join_documents(docs, front_pad=max_depth)
        if len(tokens) > max_depth + 1 and int(tokens.max()) >= vocab_size:
            raise InvalidParameterError(
                f"token id {int(tokens.max())} is outside the vocabulary ({vocab_size})"
            )
        size = len(tokens)
        starts = _reversed_order(tokens[::-1].copy(), max_depth)
        ends = size - 1 - starts  # reversed start s reads tokens backwards from size-1-s
        # Only positions with a token after them can be continued: the rest are left out.
        order = ends[(tokens[ends] != SEP) & (tokens[np.minimum(ends + 1, size - 1)] != SEP)]
        order = order.astype(np.int32)
        header = IndexHeader(
            vocab_size=vocab_size,
            tokenizer=tokenizer,
            target=target,
            documents=len(docs),
            tokens=int(sum(len(d) for d in docs)),
            max_depth=max_depth,
            source=source,
        )
        return cls(tokens, order, header)

    def find(self, tail: Document) -> Match | None:
        """The longest suffix of ``tail`` (at most ``max_depth`` tokens) in the corpus."""
        for length, ends in self.matches(tail):
            return Match(length, thin(ends), self.tokens)
        return None

    def chain(
        self,
        tail: TokenArray,
        caps: npt.NDArray[np.int64],
        min_prob: float,
        live: npt.NDArray[np.bool_] | None = None,
    ) -> suffix_kernels.Chain:
        """``continuation(find(tail), caps[its length], min_prob)`` with its length, in
        one compiled call (a suffix drafter's chain step); ``live``: see
        ``suffix_kernels.index_chain``."""
        return suffix_kernels.index_chain(
            self.tokens,
            self.order,
            self.first,
            tail,
            self.max_depth,
            caps,
            min_prob,
            MAX_OCCURRENCES,
            live,
        )

    def matches(self, tail: Document) -> Iterator[tuple[int, IntArray]]:
        """Every suffix of ``tail`` (at most ``max_depth`` tokens) found, longest first:
        (its length, all its occurrences' ends, unthinned)."""
        if len(tail) == 0:
            return
        bounds = suffix_kernels.narrow(
            self.tokens, self.order, self.first, _as_tail(tail), self.max_depth
        )
        for length in range(len(bounds), 0, -1):
            lo, hi = bounds[length - 1]
            yield length, self.order[lo:hi].astype(np.int64)

    def save(self, path: Path) -> None:
        """One ``.npz`` file: the header (JSON), the token stream and the order."""
        with path.open("wb") as file:
            np.savez_compressed(
                file,
                header=np.frombuffer(self.header.to_json().encode(), dtype=np.uint8),
                tokens=self.tokens,
                order=self.order,
            )

    @classmethod
    def load(cls, path: Path) -> SuffixIndex:
        try:
            with np.load(path, allow_pickle=False) as data:
                header = _header(path, data)
                tokens = np.ascontiguousarray(data["tokens"], dtype=np.int32)
                order = np.ascontiguousarray(data["order"], dtype=np.int32)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"cannot read suffix index {path}: {exc}") from exc
        return cls(tokens, order, header)

    @staticmethod
    def read_header(path: Path) -> IndexHeader:
        """The header of the index file at ``path`` alone (the arrays are not read)."""
        try:
            with np.load(path, allow_pickle=False) as data:
                return _header(path, data)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"cannot read suffix index {path}: {exc}") from exc

    def check_vocabulary(self, vocab_size: int, fingerprint: str, target: str) -> None:
        """Raise unless the index was built with this target's vocabulary."""
        if not self.header.serves(vocab_size, fingerprint):
            raise IncompatibleModelsError(
                f"suffix index for '{self.header.target}' (vocabulary {self.header.vocab_size}, "
                f"tokenizer {self.header.tokenizer}) cannot serve '{target}' (vocabulary "
                f"{vocab_size}, tokenizer {fingerprint})"
            )

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.order.nbytes + self.first.nbytes)
