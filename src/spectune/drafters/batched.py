"""Simple drafters in a batch: one per-sequence ``Drafter`` per row, lifted to a state.

N-gram lookup and the test doubles need no batching: ``PerRow(factory)`` is the one
adapter that makes any ``Drafter`` a ``DraftSource``; its row sets
(``PerSequenceDrafters``) give each row its own drafter and propose row after row.
Learned drafters are sources of their own (``spectune.drafters.model``,
``spectune.drafters.feature``); ``batch_source`` picks between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from spectune.draft import Draft, Refusal
from spectune.drafters.base import (
    Drafter,
    DraftRequest,
    DraftSource,
    TargetFeatures,
    fresh_drafter,
    model_free,
)

__all__ = ["PerRow", "PerSequenceDrafters", "batch_source"]


class PerRow:
    """A ``DraftSource`` of simple drafters: each row of a row set gets its own from
    ``factory`` (a zero-argument callable, e.g. ``NgramDrafter``)."""

    def __init__(self, factory: Callable[[], Drafter]) -> None:
        self.factory = factory
        sample = factory()
        self.name = sample.name
        self.model_free = model_free(sample)  # ModelFree: the engine may check its guesses

    def open(self, rows: int, capacity: int | None = None, slack: int = 0) -> PerSequenceDrafters:
        """Rows of per-sequence drafters (they hold contexts of any length)."""
        return PerSequenceDrafters(self.factory, rows, self.name, model_free=self.model_free)


class PerSequenceDrafters:
    """One ``Drafter`` per sequence, made by ``factory``; failures stay per sequence."""

    def __init__(
        self, factory: Callable[[], Drafter], max_batch: int, name: str, *, model_free: bool
    ) -> None:
        self.factory = factory
        self.drafters: list[Drafter | None] = [None] * max_batch
        self.name = name
        self.model_free = model_free

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        drafter = self.factory()
        drafter.reset()
        self.drafters[row] = drafter
        drafter.commit(list(prompt), features)

    def move(self, src: int, dst: int) -> None:
        self.drafters[dst], self.drafters[src] = self.drafters[src], None

    def free(self, row: int) -> None:
        self.drafters[row] = None

    def propose(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft | Refusal]:
        drafts: list[Draft | Refusal] = []
        for req in requests:
            drafter = self.drafters[req.row]
            if drafter is None:
                drafts.append(Refusal.error("no drafter for this row"))
                continue
            try:
                drafts.append(drafter.propose(req.context, req.k, req.params, req.generator))
            except Exception as exc:  # one sequence's drafter failing never fails the batch
                drafts.append(Refusal.error(exc))
        return drafts

    def commit(self, row: int, context: Sequence[int], features: TargetFeatures | None) -> None:
        drafter = self.drafters[row]
        if drafter is not None:
            drafter.commit(context, features)


def batch_source(drafter: Drafter) -> DraftSource:
    """What a batched engine opens a row set from for ``drafter``: the drafter itself where
    it is a source (a learned drafter, written for rows), else ``PerRow`` copies of it
    (``fresh_drafter``: ``InvalidParameterError`` for a drafter that cannot copy itself)."""
    if isinstance(drafter, DraftSource):
        return drafter
    return PerRow(partial(fresh_drafter, drafter))
