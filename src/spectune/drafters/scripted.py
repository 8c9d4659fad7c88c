"""Test doubles shipped with the package: drafters whose behaviour is written down.

Like httpx's ``MockTransport``: users test their own controllers and servers with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from spectune.draft import Draft, Refusal
from spectune.drafters.base import Drafter, DraftRequest, TargetFeatures
from spectune.sampling import SamplingParams

__all__ = ["FailingDrafter", "ScriptedDrafter", "ScriptedRows"]


class ScriptedDrafter:
    """Proposes ``script(context, k)``; probabilities are one-hot unless ``probs`` is given.

    ``delay`` seconds are slept per proposal, to script a slow drafter.
    """

    def __init__(
        self,
        script: Callable[[Sequence[int], int], list[int]],
        *,
        vocab_size: int,
        with_probs: bool = True,
        delay: float = 0.0,
        name: str = "scripted",
    ) -> None:
        self.script = script
        self.vocab_size = vocab_size
        self.with_probs = with_probs
        self.delay = delay
        self.name = name
        self.commits = 0

    def reset(self) -> None:
        self.commits = 0

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        if self.delay:
            time.sleep(self.delay)
        tokens = torch.tensor(self.script(context, num_tokens)[:num_tokens], dtype=torch.long)
        if not self.with_probs:
            return Draft(tokens, None)
        probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        return Draft(tokens, probs)

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        self.commits += 1


class ScriptedRows:
    """A ``DraftRows`` whose answer to each request is ``answer(request)`` (a draft or a
    refusal); it keeps no per-row state and counts the rows it was told about."""

    def __init__(
        self, answer: Callable[[DraftRequest], Draft | Refusal], *, name: str = "scripted"
    ) -> None:
        self.answer = answer
        self.name = name
        self.rows: set[int] = set()

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        self.rows.add(row)

    def move(self, src: int, dst: int) -> None:
        self.rows.discard(src)
        self.rows.add(dst)

    def free(self, row: int) -> None:
        self.rows.discard(row)

    def propose(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft | Refusal]:
        return [self.answer(request) for request in requests]

    def commit(self, row: int, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Nothing to keep."""


class FailingDrafter:
    """Misbehaves on purpose, starting at proposal number ``after`` + 1: ``mode`` is
    ``raise``, ``nan`` (NaN probabilities), ``oov`` (token ids outside the vocabulary) or
    ``hang`` (that one proposal sleeps ``hang_seconds``, then answers).

    Its good proposals are ``inner``'s when given (so a real drafter can fail part-way
    through a request), else zeros with uniform probabilities.
    """

    def __init__(
        self,
        mode: str,
        *,
        vocab_size: int,
        after: int = 0,
        inner: Drafter | None = None,
        hang_seconds: float = 1.0,
    ) -> None:
        if mode not in ("raise", "nan", "oov", "hang"):
            raise ValueError(f"unknown failure mode {mode!r}")
        self.mode = mode
        self.vocab_size = vocab_size
        self.after = after
        self.inner = inner
        self.hang_seconds = hang_seconds
        self.calls = 0
        self.name = f"failing:{mode}" if inner is None else inner.name

    def reset(self) -> None:
        self.calls = 0
        if self.inner is not None:
            self.inner.reset()

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        self.calls += 1
        if self.inner is not None:
            draft = self.inner.propose(context, num_tokens, params, generator)
        else:
            uniform = torch.full((num_tokens, self.vocab_size), 1.0 / self.vocab_size)
            draft = Draft(torch.zeros(num_tokens, dtype=torch.long), uniform)
        if self.calls <= self.after:
            return draft
        if self.mode == "raise":
            raise RuntimeError("scripted drafter failure")
        if self.mode == "nan":
            nan = torch.full((len(draft), self.vocab_size), float("nan"))
            return Draft(draft.tokens, nan, draft.parents)
        if self.mode == "hang":
            if self.calls == self.after + 1:
                time.sleep(self.hang_seconds)
            return draft
        return Draft(draft.tokens + self.vocab_size + 7, draft.probs, draft.parents)

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        if self.inner is not None:
            self.inner.commit(context, features)
