"""Does a server's acceptance rise as earlier outputs accumulate? (suffix drafting's history)

A repeated workload (the prompt set, cycled) is served one request at a time the way the
server's per-request drafters are: a ``fresh_drafter`` copy per request, sharing the
server's ``HistoryStore``, dropped when the request ends (which files its output in the
history). Counts are reported per window of requests: the first ``window`` against the
next ``window``, and so on. With ``history_tokens = 0`` the same run without history is
the control.
"""

from __future__ import annotations

import dataclasses

from spectune.drafters.pairing import fresh_drafter, with_history
from spectune.drafters.suffix_history import HistoryStore
from spectune.errors import InvalidParameterError
from spectune.experiments.common import DecodeStats, Setup, decode_prompts
from spectune.sampling import SamplingParams

__all__ = ["history_acceptance"]


def history_acceptance(
    setup: Setup,
    *,
    requests: int,
    window: int,
    history_tokens: int,
    k: int = 4,
    max_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[DecodeStats]:
    """One ``DecodeStats`` per window of consecutive requests (label ``requests A-B``)."""
    if requests < 1 or window < 1:
        raise InvalidParameterError("requests and window must be >= 1")
    history = HistoryStore(history_tokens) if history_tokens > 0 else None
    served = with_history(setup.draft, history)
    if served is None:
        raise InvalidParameterError("the history experiment needs a drafter")
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    windows = []
    for start in range(0, requests, window):
        numbers = range(start, min(start + window, requests))
        prompts = tuple(setup.prompts[n % len(setup.prompts)] for n in numbers)
        # decode_prompts drops each request's engine (and drafter) before the next one
        # starts, which files the output in the history.
        windows.append(
            decode_prompts(
                dataclasses.replace(setup, prompts=prompts),
                f"requests {start + 1}-{start + len(prompts)}",
                lambda: fresh_drafter(served),
                params,
                k,
                seed=seed + start,
            )
        )
    return windows
