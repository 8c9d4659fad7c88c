"""The one change spectune's proposer makes to vLLM's own work per step (option
``patch_sampler``, on by default).

With any speculative config, vLLM 0.32 samples every step through its rejection sampler
(``vllm/v1/sample/rejection_sampler.py``), drafts or not. When the batch holds a request
at T > 0, ``rejection_sample`` calls ``sample_recovered_tokens``, which draws exponential
noise of shape [batch, vocabulary] and its reciprocal, to sample a recovered token for
each rejected draft position. On a step where no row has a draft token there is no
position to recover: the kernel that follows reads none of it, and the result is an
empty tensor. vLLM still draws it, every step: work that grows with batch and
vocabulary and that plain decoding does not do (the CPU build's plain sampler draws its
noise inside one fused kernel). Where drafting does not pay and the proposer holds every
request, every step is such a step.

``skip_idle_noise`` wraps ``sample_recovered_tokens`` so that a step without draft tokens
returns the same empty tensor without drawing. Output is unchanged: the draw is skipped
only where nothing reads it; a seeded request's own generator is untouched either way
(vLLM draws from it only for rows with drafts); unseeded requests draw from the global
generator, whose stream then differs, not its distribution.

The wrapper checks the function's parameters first and leaves a vLLM whose
``sample_recovered_tokens`` takes others untouched (with one line saying so).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["RECOVERED_PARAMETERS", "skip_idle_noise"]

# The leading parameters of vLLM 0.32's sample_recovered_tokens the wrapper reads.
RECOVERED_PARAMETERS = (
    "max_spec_len",
    "num_draft_tokens",
    "cu_num_draft_tokens",
    "draft_token_ids",
)


def skip_idle_noise(module: Any) -> str:
    """Wrap ``module.sample_recovered_tokens`` (vLLM's rejection sampler module) as the
    module docstring says; idempotent. One line on what was done, for the log."""
    original = getattr(module, "sample_recovered_tokens", None)
    if getattr(original, "skips_idle_noise", False):
        return "vLLM's rejection sampler already skips its noise on steps without drafts"
    if not callable(original) or _parameters(original) != RECOVERED_PARAMETERS:
        return (
            "this vLLM's sample_recovered_tokens is not vLLM 0.32's: its noise on steps "
            "without drafts is drawn as vLLM does"
        )
    module.sample_recovered_tokens = _skipping(original)
    return "vLLM's rejection sampler skips its recovered-token noise on steps without drafts"


def _parameters(function: Callable[..., Any]) -> tuple[str, ...]:
    """The names of the first parameters of ``function`` that the wrapper reads."""
    try:
        names = tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # not a Python function
        return ()
    return names[: len(RECOVERED_PARAMETERS)]


def _skipping(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def sample_recovered_tokens(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = dict(zip(RECOVERED_PARAMETERS, args, strict=False)) | kwargs
        if bound["max_spec_len"] == 0:  # no row has a draft token: nothing to recover
            draft_token_ids: torch.Tensor = bound["draft_token_ids"]  # [0]
            return torch.empty_like(draft_token_ids)
        return original(*args, **kwargs)

    sample_recovered_tokens.skips_idle_noise = True  # type: ignore[attr-defined]
    return sample_recovered_tokens
