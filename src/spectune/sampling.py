"""Sampling parameters and the one place logits become a distribution.

The verifier applies exactly the same processing to target and draft logits, so
rejection sampling compares like with like (Leviathan et al. 2023, section 3.3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from spectune.errors import InvalidParameterError

__all__ = [
    "PositionStream",
    "SamplingParams",
    "argmax_rows",
    "process_logits",
    "sample_from",
    "sample_with",
]

MAX_SEED = 2**63 - 1  # the largest seed a torch.Generator takes


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables nucleus filtering
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise InvalidParameterError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature > 100.0:
            raise InvalidParameterError(f"temperature must be <= 100, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidParameterError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise InvalidParameterError("stop strings must be non-empty")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            # torch.Generator takes 64-bit seeds; larger ones fail deep inside it.
            raise InvalidParameterError(f"seed must be in [0, 2**63 - 1], got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def argmax_rows(logits: Tensor) -> list[int]:
    """Each row's largest entry (the first among ties, as ``torch.argmax``): [rows, vocab]
    -> ``rows`` token ids. Greedy verification's hot path. On the CPU in fp32 it takes
    numpy's vectorised argmax: torch's took 620 us for 5 rows of 49,152 logits on this
    project's CPU, numpy's 30 us (a target step on llama.cpp is about 8 ms)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return [int(i) for i in logits.detach().numpy().argmax(-1)]
    return [int(i) for i in logits.argmax(-1).tolist()]


def process_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Turn logits into the probabilities tokens are actually drawn from.

    logits: [..., vocab] (any float dtype; computed in fp32). Returns [..., vocab] fp32.
    Order: temperature, then top-k, then top-p (the order of HF's and vLLM's samplers).
    Greedy parameters give a one-hot distribution on the argmax, so the verifier's
    sampling rule reduces to exact greedy matching.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        logits = logits.masked_fill(~_nucleus(logits, params.top_p), float("-inf"))
    return logits.softmax(-1)


# The nucleus is looked for among the most probable tokens first: a full sort of a
# 49,152-wide row took 3.5 ms on one CPU thread, a top-256 0.1 ms (AMD EPYC, 2026-12-04).
_NUCLEUS_FIRST_LOOK = 256


def _nucleus(logits: Tensor, top_p: float) -> Tensor:
    """[..., vocab] bool: the smallest most-probable prefix whose mass reaches ``top_p``
    (a token is dropped when the mass strictly before it already reaches ``top_p``; the
    most probable token always stays). Exact: the prefix is searched among the ``m`` most
    probable tokens, ``m`` growing fourfold until their mass reaches ``top_p`` in every
    row (the whole vocabulary at worst), so no token outside them could belong to it."""
    probs = logits.softmax(-1)
    vocab = probs.shape[-1]
    width = min(_NUCLEUS_FIRST_LOOK, vocab)
    while True:
        top_probs, top_ids = torch.topk(probs, width, dim=-1)  # sorted, most probable first
        mass = top_probs.cumsum(-1)
        if width == vocab or bool((mass[..., -1] >= top_p).all()):
            break
        width = min(width * 4, vocab)
    keep_sorted = (mass - top_probs) < top_p
    # Enforced, not assumed: a top_p below fp32's smallest number rounds to 0 and
    # would otherwise drop every token (NaN probabilities).
    keep_sorted[..., 0] = True
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, top_ids, keep_sorted)


def sample_from(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """Draw one token per row. probs: [..., vocab] -> [...] token ids.

    Uses inverse-CDF sampling with exactly one uniform number per row, so the random
    stream's consumption is fixed and documented (one draw per sampled token).
    """
    uniforms = torch.rand(probs.shape[:-1], generator=generator, device=probs.device)
    return sample_with(probs, uniforms)


def sample_with(probs: Tensor, uniforms: Tensor) -> Tensor:
    """The token each row's inverse CDF gives at its uniform: probs [..., vocab] and
    uniforms [...] in [0, 1) -> [...] token ids. Unnormalised rows (residuals) are scaled
    by their mass; a zero-probability token is never returned."""
    flat = probs.reshape(-1, probs.shape[-1])  # [rows, vocab]
    u = uniforms.reshape(-1, 1).to(device=flat.device, dtype=flat.dtype)  # [rows, 1]
    cdf = flat.cumsum(-1)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    idx = idx.clamp_max(flat.shape[-1] - 1)
    # Never land on a zero-probability token through rounding at the top of the CDF.
    idx = torch.where(flat.gather(-1, idx) > 0, idx, flat.argmax(-1, keepdim=True))
    return idx.reshape(probs.shape[:-1])


class PositionStream:
    """A request's uniforms keyed by output position: number t decides the t-th output
    token whenever the target chooses that token itself (a plain step, a bonus or a
    recovered token, or a token checked against a draft without probabilities;
    ``spectune.verify.chain``), whatever the steps before it drafted.

    So a request whose drafts carry no probabilities emits the same tokens at any K, in
    any batch: every token is the target's inverse-CDF draw at its position's number,
    and a draft token is kept exactly when it equals that draw. The numbers are drawn
    from the stream's own generator in blocks of ``BLOCK`` (the t-th number is always
    the generator's t-th, however the positions are asked for) and nothing else draws
    from it.
    """

    BLOCK = 64

    def __init__(self, seed: int) -> None:
        self._generator = torch.Generator()
        self._generator.manual_seed(seed)
        self._drawn = torch.empty(0)  # [positions drawn so far] fp32

    @classmethod
    def split_from(cls, generator: torch.Generator) -> PositionStream:
        """A stream seeded by one 63-bit draw from ``generator`` (the request's stream)."""
        seed = int(torch.randint(0, MAX_SEED, (1,), generator=generator))
        return cls(seed)

    def at(self, start: int, count: int) -> Tensor:
        """[count] fp32: the numbers of output positions ``start .. start + count - 1``."""
        if start < 0 or count < 0:
            raise ValueError(f"positions from {start}, {count} of them")
        while self._drawn.shape[0] < start + count:
            block = torch.rand(self.BLOCK, generator=self._generator)
            self._drawn = torch.cat((self._drawn, block))
        return self._drawn[start : start + count]
