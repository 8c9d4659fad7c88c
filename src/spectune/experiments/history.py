"""Does a server's acceptance rise as earlier outputs accumulate? (suffix drafting's history)

A repeated workload (the prompt set, cycled) is served one request at a time the way the
server's per-request drafters are: a ``fresh_drafter`` copy per request, sharing the
server's ``HistoryStore``, dropped when the request ends (which files its output in the
history). Acceptance is reported per window of requests: the first ``window`` against
the next ``window``, and so on. With ``history_tokens = 0`` the same run without history
is the control.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.control.base import FixedK
from spectune.drafters.base import Drafter
from spectune.drafters.suffix_index import HistoryStore
from spectune.engine import SpeculativeEngine
from spectune.errors import InvalidParameterError
from spectune.experiments.common import Setup
from spectune.pairing import fresh_drafter, with_history
from spectune.sampling import SamplingParams

__all__ = ["WindowStats", "history_acceptance"]


@dataclass(frozen=True)
class WindowStats:
    """Counts over one window of consecutive requests; rates derived here only."""

    first_request: int
    requests: int
    steps: int
    drafted: int
    accepted: int
    tokens: int

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Emitted tokens per target step (1 without drafts)."""
        return self.tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            **vars(self),
            "acceptance": self.acceptance,
            "tokens_per_step": self.tokens_per_step,
        }


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
) -> list[WindowStats]:
    if requests < 1 or window < 1:
        raise InvalidParameterError("requests and window must be >= 1")
    history = HistoryStore(history_tokens) if history_tokens > 0 else None
    served: Drafter | None = with_history(setup.draft, history)
    assert served is not None
    counts: list[tuple[int, int, int, int]] = []  # per request: steps, drafted, accepted, tokens
    for number in range(requests):
        _, prompt = setup.prompts[number % len(setup.prompts)]
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + number)
        drafter = fresh_drafter(served)
        gen = SpeculativeEngine(setup.target, drafter).run(
            list(prompt), params, policy=FixedK(k), generator=torch.Generator().manual_seed(seed)
        )
        counts.append((len(gen.steps), gen.drafted, gen.accepted, len(gen.tokens)))
        del drafter  # the request ends: its output goes to the history
    windows = []
    for start in range(0, requests, window):
        part = counts[start : start + window]
        steps, drafted, accepted, tokens = (sum(c[i] for c in part) for i in range(4))
        windows.append(WindowStats(start, len(part), steps, drafted, accepted, tokens))
    return windows
