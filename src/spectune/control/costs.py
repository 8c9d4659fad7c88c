"""Measured costs and the analytic speedup model every K decision rests on.

Glossary (Leviathan et al. 2023, section 3.4; the seed's formula):
- alpha (acceptance)      expected probability that a draft token is accepted.
- draft cost c            one draft step's time divided by one target step's time.
- verification curve v(k) the target's forward time over k + 1 tokens divided by its time
                          over one token (v(0) = 1: plain decoding).
- expected tokens/step    (1 - alpha^(k+1)) / (1 - alpha)  (accepted plus the bonus token).
- predicted speedup       S(k) = (1 - alpha^(k+1)) / ((1 - alpha) (k c + v(k))),
                          relative to plain decoding; S(0) = 1.

Costs are measured on the machine at hand, never assumed: a forward over 8 tokens costs
~1.1x one token on one CPU and ~8x on another.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spectune.models.base import LanguageModel

__all__ = [
    "CostCurve",
    "break_even_acceptance",
    "ewma",
    "expected_tokens_per_step",
    "measure_forward_curve",
    "measure_step_time",
    "nondecreasing",
    "optimal_k",
    "predicted_speedup",
    "speedup_of_tokens",
]


@dataclass(frozen=True)
class CostCurve:
    """Median seconds of one forward over ``sizes[i]`` tokens (after a fixed-length prefix)."""

    sizes: tuple[int, ...]  # chunk lengths measured, ascending, starting at 1
    seconds: tuple[float, ...]
    # Where measured: the median over sizes of the repeated timings' range over their
    # median ((max - min) / median); a quiet machine keeps it to a few percent.
    spread: float | None = field(default=None, compare=False)

    @functools.cached_property
    def _dense(self) -> int:
        """n where ``sizes`` is exactly 1..n (a learned curve), else 0: ``time`` is then a
        lookup (a K decision reads it a few hundred times)."""
        return len(self.sizes) if self.sizes == tuple(range(1, len(self.sizes) + 1)) else 0

    def time(self, tokens: int) -> float:
        """Seconds for a forward over ``tokens``, linearly interpolated between measurements."""
        sizes, secs = self.sizes, self.seconds
        if 1 <= tokens <= self._dense:
            return secs[tokens - 1]
        if tokens <= sizes[0]:
            return secs[0]
        for i in range(1, len(sizes)):
            if tokens <= sizes[i]:
                n0, n1, t0, t1 = sizes[i - 1], sizes[i], secs[i - 1], secs[i]
                return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)
        # Past the last measurement: extrapolate the last segment's slope.
        n0, n1, t0, t1 = sizes[-2], sizes[-1], secs[-2], secs[-1]
        return t1 + (t1 - t0) / (n1 - n0) * (tokens - n1)

    def relative(self, k: int) -> float:
        """v(k): cost of verifying k draft tokens (a forward over k + 1) over one token."""
        return self.time(k + 1) / self.seconds[0]


def _forward_times(
    model: LanguageModel, sizes: Sequence[int], *, prefix: int, repeats: int, seed: int = 0
) -> dict[int, list[float]]:
    """Seconds of ``repeats`` forwards over each of ``sizes`` tokens after one cached
    ``prefix``, sizes interleaved within each repeat. The prefix is computed once; each timed
    forward follows an untimed one of its own shape (timed right after a forward of another
    size, the int4 kernels measured v(2) 1.07 where decoding pays 1.30)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.info.vocab_size
    cache = model.new_cache(capacity=prefix + max(sizes) + 1)
    model.forward(torch.randint(0, vocab, (1, prefix), generator=generator), cache)
    chunks = {n: torch.randint(0, vocab, (1, n), generator=generator) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n, chunk in chunks.items():
            model.forward(chunk, cache)  # warm-up at this shape
            cache.truncate(prefix)
            start = time.perf_counter()
            model.forward(chunk, cache)
            times[n].append(time.perf_counter() - start)
            cache.truncate(prefix)
    return times


def measure_step_time(
    model: LanguageModel, tokens: int, *, prefix: int = 64, repeats: int = 5, seed: int = 0
) -> float:
    """Median seconds for one forward over ``tokens`` after ``prefix`` cached tokens."""
    times = _forward_times(model, (tokens,), prefix=prefix, repeats=repeats, seed=seed)
    return statistics.median(times[tokens])


def measure_forward_curve(
    model: LanguageModel,
    sizes: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16),
    *,
    prefix: int = 64,
    repeats: int = 5,
) -> CostCurve:
    """The verification-cost curve of ``model`` on this machine. Sizes interleave over
    repeats so slow drift of the machine hits every size alike. A forward over more tokens
    never costs less, so where the medians dip (noise: a shared CPU, int4 kernels that
    switch tile shapes) the curve is their isotonic fit, the non-decreasing sequence nearest
    to them (adjacent violators pooled into their mean): a dip at one K would otherwise make
    that K look cheap to every prediction and policy search that reads the curve."""
    ordered = sorted(set(sizes))
    if not ordered or ordered[0] != 1:
        raise ValueError("the curve must start at one token")
    times = _forward_times(model, ordered, prefix=prefix, repeats=repeats)
    medians = [statistics.median(times[n]) for n in ordered]
    ranges = [(max(times[n]) - min(times[n])) / m for n, m in zip(ordered, medians, strict=True)]
    spread = statistics.median(ranges)
    return CostCurve(tuple(ordered), nondecreasing(medians), spread)


def nondecreasing(seconds: Sequence[float]) -> tuple[float, ...]:
    """The non-decreasing sequence nearest to ``seconds`` in least squares (isotonic
    regression: adjacent violators pooled into their mean); ``seconds`` when it already is."""
    from scipy.optimize import isotonic_regression

    return tuple(float(t) for t in isotonic_regression(list(seconds), increasing=True).x)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): accepted tokens plus the bonus, i.i.d. acceptance."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(
    alpha: float,
    draft_cost: float,
    curve: CostCurve,
    k: int,
    *,
    verify_cost: float | None = None,
    coverage: float = 1.0,
) -> float:
    """S(k) relative to plain decoding; S(0) = 1. ``verify_cost``: the target's cost of
    verifying k tokens in units of a one-token step (default ``curve.relative(k)``, one
    pass; chunked verification passes its expected cost). ``coverage``: the fraction of
    steps at which the drafter proposes at all (a suffix drafter finds no match at the
    others, which are then plain steps: one token for one target forward)."""
    if k == 0:
        return 1.0
    verify = curve.relative(k) if verify_cost is None else verify_cost
    tokens = coverage * expected_tokens_per_step(alpha, k) + (1.0 - coverage)
    return tokens / (coverage * (k * draft_cost + verify) + (1.0 - coverage))


def break_even_acceptance(
    draft_cost: float, curve: CostCurve, k: int, *, tolerance: float = 1e-6
) -> float | None:
    """The acceptance alpha at which S(k) = 1: below it drafting k tokens is slower than
    plain decoding. None when no alpha reaches it (even alpha = 1 gives k + 1 tokens for
    k c + v(k) > k + 1). S(k) rises with alpha, so bisection finds the root."""
    if k < 1:
        raise ValueError("break-even acceptance needs k >= 1")
    if predicted_speedup(1.0, draft_cost, curve, k) <= 1.0:
        return None
    if predicted_speedup(0.0, draft_cost, curve, k) >= 1.0:
        return 0.0
    low, high = 0.0, 1.0
    while high - low > tolerance:
        mid = (low + high) / 2
        if predicted_speedup(mid, draft_cost, curve, k) < 1.0:
            low = mid
        else:
            high = mid
    return high


def speedup_of_tokens(
    tokens_per_step: float,
    draft_cost: float,
    curve: CostCurve,
    k: int,
    *,
    verify_cost: float | None = None,
) -> float:
    """S(k) for a step that yields ``tokens_per_step`` (measured, e.g. from per-position
    acceptance, instead of the i.i.d. formula): tokens / (k c + v(k)); S(0) = 1."""
    if k == 0:
        return 1.0
    verify = curve.relative(k) if verify_cost is None else verify_cost
    return tokens_per_step / (k * draft_cost + verify)


def ewma(old: float | None, new: float, weight: float) -> float:
    """Exponentially weighted moving average: ``new`` itself when there is no ``old``."""
    return new if old is None else (1.0 - weight) * old + weight * new


def optimal_k(
    alpha: float, draft_cost: float, curve: CostCurve, *, max_k: int = 8
) -> tuple[int, float]:
    """The K in [0, max_k] with the highest predicted speedup (0 when none beats plain)."""
    best_k, best = 0, 1.0
    for k in range(1, max_k + 1):
        speedup = predicted_speedup(alpha, draft_cost, curve, k)
        if speedup > best:
            best_k, best = k, speedup
    return best_k, best
