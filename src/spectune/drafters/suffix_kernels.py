"""The inner loops of suffix lookup, compiled (numba): the drafting step's hot path.

A suffix drafter looks up every source on every step, and the target step it must stay
cheap against is 11-60 ms on this project's CPUs. In numpy each lookup was a few dozen
small array operations, and right after a target forward (caches cold) those cost
0.2-0.6 ms together: 1-2.5% of an int4 step. These loops do the same work element by element
in compiled code, in microseconds, and release the GIL (a server drafts in threads).

Every stream here is int32 with SEP (-1) between documents; positions are int64.
Functions are compiled on first call and cached next to this file (``cache=True``), so
only a process on a fresh install pays the compilation (about a second); loading them from
that cache still takes 0.2-0.4 s, which ``warm_up`` spends when a suffix drafter is made
rather than on its first drafting step.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["Chain", "chain", "index_chain", "narrow", "scan", "scan_chain", "thin", "warm_up"]


@numba.njit(nogil=True, cache=True)
def _scan(
    tokens: npt.NDArray[np.int32],  # [n] the stream
    tail: npt.NDArray[np.int32],  # [m] the context's tail, SEP-free
    max_depth: int,
    stop: int,  # occurrences must end before this index (and before n - 1)
) -> tuple[int, npt.NDArray[np.int64]]:
    """(longest matched length, ascending ends of its occurrences); (0, []) if none."""
    depth_cap = min(max_depth, tail.shape[0])
    last = tail[tail.shape[0] - 1]
    best = 0
    count = 0
    ends = np.empty(max(stop, 0), np.int64)
    for end in range(stop):
        if tokens[end] != last or tokens[end + 1] < 0:
            continue
        length = 1
        while (
            length < depth_cap
            and end - length >= 0
            and tokens[end - length] == tail[tail.shape[0] - 1 - length]
        ):
            length += 1
        if length > best:
            best, count = length, 0
        if length == best:
            ends[count] = end
            count += 1
    return best, ends[:count]


# Below this many candidates a suffix array range is narrowed by extending each candidate
# backwards (one cache line each) instead of bisecting (two scattered reads per probe).
_EXTEND_BELOW = 32


@numba.njit(nogil=True, cache=True)
def _narrow(
    tokens: npt.NDArray[np.int32],  # [n] the stream, front-padded with max_depth SEPs
    order: npt.NDArray[np.int32],  # [p] positions sorted by the tokens read backwards
    first: npt.NDArray[np.int64],  # [v + 1] order[first[t]:first[t + 1]]: token t's range
    tail: npt.NDArray[np.int32],  # [m] the context's tail, SEP-free
    bounds: npt.NDArray[np.int64],  # [min(m, max_depth) + 1, 2] out: (lo, hi) per length
) -> int:
    """The longest matched length L; ``order[bounds[l, 0]:bounds[l, 1]]`` are the
    occurrences of the last ``l`` tokens of ``tail`` for every l <= L (nested ranges).

    Right after a target forward the arrays are out of cache, so reads are what cost:
    the first token's range comes from a table, longer ones by bisection while the range
    is wide, then by extending each remaining candidate (its tokens are adjacent)."""
    cap = bounds.shape[0] - 1
    last = tail[tail.shape[0] - 1]
    if last + 1 >= first.shape[0] or first[last] == first[last + 1]:
        return 0
    lo, hi = first[last], first[last + 1]
    bounds[1, 0], bounds[1, 1] = lo, hi
    length = 1
    while length < cap and hi - lo > _EXTEND_BELOW:
        want = tail[tail.shape[0] - 1 - length]
        # Inside [lo, hi) every key tokens[order[i] - length] is sorted: bisect it.
        a, b = lo, hi
        while a < b:  # first index whose key >= want
            mid = (a + b) // 2
            if tokens[order[mid] - length] < want:
                a = mid + 1
            else:
                b = mid
        c, b = a, hi
        while c < b:  # first index whose key > want
            mid = (c + b) // 2
            if tokens[order[mid] - length] <= want:
                c = mid + 1
            else:
                b = mid
        if a == c:
            return length
        lo, hi, length = a, c, length + 1
        bounds[length, 0], bounds[length, 1] = lo, hi
    if length == cap:
        return length
    # Few candidates: how far does each match? Those matching at least l tokens are one
    # contiguous run of the range (the array is sorted that deep), for every l.
    reach = np.empty(hi - lo, np.int64)
    for i in range(lo, hi):
        matched = length
        while matched < cap and tokens[order[i] - matched] == tail[tail.shape[0] - 1 - matched]:
            matched += 1
        reach[i - lo] = matched
    longest = length
    for deeper in range(length + 1, cap + 1):
        a = lo
        while a < hi and reach[a - lo] < deeper:
            a += 1
        if a == hi:
            break
        b = a
        while b < hi and reach[b - lo] >= deeper:
            b += 1
        bounds[deeper, 0], bounds[deeper, 1] = a, b
        longest = deeper
    return longest


@numba.njit(nogil=True, cache=True)
def _chain(
    tokens: npt.NDArray[np.int32],  # [n] the stream; every document ends with SEP
    ends: npt.NDArray[np.int64],  # [o] the occurrences' last positions
    max_tokens: int,
    min_prob: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The most frequent continuation of the occurrences, token by token (``continuation``)."""
    total = ends.shape[0]
    live = ends.copy()
    count = total
    out_tokens = np.empty(max_tokens, np.int64)
    out_probs = np.empty(max_tokens, np.float64)
    size = 0
    following = np.empty(total, np.int32)
    for step in range(1, max_tokens + 1):
        for i in range(count):
            following[i] = tokens[live[i] + step]  # in bounds: SEP ends every document
        ordered = np.sort(following[:count])
        best, best_count, run = -1, 0, 0
        for i in range(count):  # the longest run of one token; ties: the first (smallest)
            if ordered[i] < 0:
                continue
            run = run + 1 if i > 0 and ordered[i] == ordered[i - 1] else 1
            if run > best_count:
                best, best_count = ordered[i], run
        if best < 0 or best_count / total < min_prob:
            break
        out_tokens[size] = best
        out_probs[size] = best_count / total
        size += 1
        kept = 0
        for i in range(count):
            if following[i] == best:
                live[kept] = live[i]
                kept += 1
        count = kept
    return out_tokens[:size], out_probs[:size]


@numba.njit(nogil=True, cache=True)
def _thin(ends: npt.NDArray[np.int64], limit: int) -> npt.NDArray[np.int64]:
    """At most ``limit`` of ``ends``, evenly spaced (the first and the last kept)."""
    if ends.shape[0] <= limit:
        return ends
    picked = np.empty(limit, np.int64)
    for j in range(limit):
        picked[j] = ends[(j * (ends.shape[0] - 1)) // (limit - 1)]
    return picked


@numba.njit(nogil=True, cache=True)
def _scan_chain(
    tokens: npt.NDArray[np.int32],
    tail: npt.NDArray[np.int32],
    max_depth: int,
    stop: int,
    caps: npt.NDArray[np.int64],  # [max_depth + 1] tokens allowed per matched length
    min_prob: float,
    limit: int,
) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64], int]:
    length, ends = _scan(tokens, tail, max_depth, stop)
    return _continued(tokens, length, ends, caps, min_prob, limit)


@numba.njit(nogil=True, cache=True)
def _index_chain(
    tokens: npt.NDArray[np.int32],
    order: npt.NDArray[np.int32],
    first: npt.NDArray[np.int64],
    tail: npt.NDArray[np.int32],
    max_depth: int,
    caps: npt.NDArray[np.int64],  # [max_depth + 1] tokens allowed per matched length
    min_prob: float,
    limit: int,
    live: npt.NDArray[np.bool_],  # [n] positions that count, or [0]: all of them
) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64], int]:
    bounds = np.zeros((min(max_depth, tail.shape[0]) + 1, 2), np.int64)
    length = _narrow(tokens, order, first, tail, bounds)
    ends = order[bounds[length, 0] : bounds[length, 1]].astype(np.int64)
    while live.shape[0] and length > 0:  # the longest suffix with an occurrence that counts
        ends = ends[live[ends]]
        if ends.shape[0]:
            break
        length -= 1
        ends = order[bounds[length, 0] : bounds[length, 1]].astype(np.int64)
    return _continued(tokens, length, ends, caps, min_prob, limit)


@numba.njit(nogil=True, cache=True)
def _continued(
    tokens: npt.NDArray[np.int32],
    length: int,  # the matched length (0: none)
    ends: npt.NDArray[np.int64],  # [o] its occurrences
    caps: npt.NDArray[np.int64],
    min_prob: float,
    limit: int,
) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64], int]:
    """A match's chain proposal: its occurrences thinned, continued up to its cap; with
    the number of occurrences kept (at most ``limit``)."""
    if length == 0:
        return 0, np.empty(0, np.int64), np.empty(0, np.float64), 0
    kept = _thin(ends, limit)
    if caps[length] == 0:
        return length, np.empty(0, np.int64), np.empty(0, np.float64), kept.shape[0]
    found, probs = _chain(tokens, kept, caps[length], min_prob)
    return length, found, probs, kept.shape[0]


def scan(
    tokens: npt.NDArray[np.int32], tail: npt.NDArray[np.int32], max_depth: int, stop: int
) -> tuple[int, npt.NDArray[np.int64]]:
    """Every occurrence of the longest suffix of ``tail`` (at most ``max_depth`` tokens)
    ending before ``stop`` with a token (not SEP) after it, by a scan: (length, ascending
    ends), length 0 where none."""
    length, ends = _scan(tokens, tail, max_depth, min(stop, len(tokens) - 1))
    return int(length), ends


def narrow(
    tokens: npt.NDArray[np.int32],
    order: npt.NDArray[np.int32],
    first: npt.NDArray[np.int64],
    tail: npt.NDArray[np.int32],
    max_depth: int,
) -> npt.NDArray[np.int64]:
    """The suffixes of ``tail`` (at most ``max_depth`` tokens) in a reversed suffix array
    (``SuffixIndex``; ``first``: each token's range of it): ``[length, 2]`` where row
    ``l - 1`` is (lo, hi) of the last ``l`` tokens' occurrences ``order[lo:hi]``, up to the
    longest matched length (no rows: not even the last token occurs)."""
    bounds = np.zeros((min(max_depth, len(tail)) + 1, 2), dtype=np.int64)
    length = _narrow(tokens, order, first, tail, bounds)
    return bounds[1 : length + 1]


def chain(
    tokens: npt.NDArray[np.int32], ends: npt.NDArray[np.int64], max_tokens: int, min_prob: float
) -> tuple[list[int], list[float]]:
    """The most frequent continuation after ``ends``: tokens and each prefix's share of all
    occurrences, stopping at ``max_tokens``, where every document ended, or before a share
    would fall below ``min_prob``. Ties go to the smaller token id."""
    if ends.size == 0 or max_tokens < 1:
        return [], []
    out_tokens, out_probs = _chain(tokens, ends, max_tokens, float(min_prob))
    return out_tokens.tolist(), out_probs.tolist()


@functools.cache
def warm_up() -> None:
    """Load (or compile) every kernel once, on a tiny stream."""
    stream = np.array([-1, 1, 2, 1, 2, -1], dtype=np.int32)
    tail = np.array([1, 2], dtype=np.int32)
    scan(stream, tail, 2, len(stream) - 1)
    first = np.array([0, 0, 1, 2])
    order = np.array([1, 3], dtype=np.int32)
    narrow(stream, order, first, tail, 2)
    chain(stream, np.array([1], dtype=np.int64), 2, 0.0)
    caps = np.array([0, 1, 2], dtype=np.int64)
    scan_chain(stream, tail, 2, len(stream) - 1, caps, 0.0, 4)
    index_chain(stream, order, first, tail, 2, caps, 0.0, 4)
    index_chain(stream, order, first, tail, 2, caps, 0.0, 4, np.ones(len(stream), np.bool_))
    thin(np.arange(9, dtype=np.int64), 4)


def thin(ends: npt.NDArray[np.int64], limit: int) -> npt.NDArray[np.int64]:
    """At most ``limit`` of ``ends`` (int64), evenly spaced, the first and last kept."""
    return _thin(ends, limit)


# The chain proposal of one source in one call: its longest match, thinned to ``limit``
# occurrences, continued up to ``caps[matched length]`` tokens (the proposal-length rule,
# ``SuffixSettings.caps``). The same as ``continuation`` after ``scan`` or ``narrow``,
# without the Python between them: each call right after a target forward costs 10-20 us.
# (matched length, tokens, path probabilities, occurrences sampled: at most ``limit``)
Chain = tuple[int, list[int], list[float], int]


def scan_chain(
    tokens: npt.NDArray[np.int32],
    tail: npt.NDArray[np.int32],
    max_depth: int,
    stop: int,
    caps: npt.NDArray[np.int64],
    min_prob: float,
    limit: int,
) -> Chain:
    """``scan`` then ``chain``, in one compiled call."""
    stop = min(stop, len(tokens) - 1)
    length, found, probs, seen = _scan_chain(tokens, tail, max_depth, stop, caps, min_prob, limit)
    return int(length), found.tolist(), probs.tolist(), int(seen)


def index_chain(
    tokens: npt.NDArray[np.int32],
    order: npt.NDArray[np.int32],
    first: npt.NDArray[np.int64],
    tail: npt.NDArray[np.int32],
    max_depth: int,
    caps: npt.NDArray[np.int64],
    min_prob: float,
    limit: int,
    live: npt.NDArray[np.bool_] | None = None,
) -> Chain:
    """``narrow`` then ``chain``, in one compiled call; ``live`` ([n]): only occurrences
    at live positions count (a server history's outputs still held)."""
    mask = _ALL_LIVE if live is None else live
    length, found, probs, seen = _index_chain(
        tokens, order, first, tail, max_depth, caps, min_prob, limit, mask
    )
    return int(length), found.tolist(), probs.tolist(), int(seen)


_ALL_LIVE = np.zeros(0, dtype=np.bool_)
