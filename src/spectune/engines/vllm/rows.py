"""Which request each row of vLLM's batch holds, and what its last step did.

After every step vLLM hands a proposer one list of sampled tokens per row of its
persistent batch (``InputBatch``). A row is not a request: when requests finish, the last
rows move into the holes (``InputBatch.condense``); an attention backend may swap rows
(``_may_reorder_batch``); a new request takes the lowest free row; a request the
scheduler skips for a step leaves the batch and comes back in another row. So nothing is
kept by row: every call reads the request id each row holds now (``req_ids[row]``) and
credits the row's step to that request.

Glossary, per row and step (vLLM's words, ``vllm/v1/sample/rejection_sampler.py``):

- verified   the draft tokens vLLM scheduled for the row's step
             (``spec_token_ids[row]``). The scheduler may cut what a proposer returned
             (token budget, ``max_model_len``), so this, not the proposal, is what was
             tested, and what vLLM's ``spec_decode_num_draft_tokens`` counts.
- kept       the row's sampled tokens: the accepted draft tokens and one token of the
             target's own (the bonus token when every draft token was accepted, else the
             recovered token that replaced the first rejected one).
- accepted   ``len(kept) - 1`` where something was verified, at most ``verified``: vLLM's
             scheduler counts ``spec_decode_num_accepted_tokens`` the same way.

A row that kept nothing is a prefill chunk that has not reached its end: no step to
credit, nothing to draft.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy.typing as npt

__all__ = ["BatchRows", "RequestTable", "RowStep", "row_steps"]


class BatchRows(Protocol):
    """What a proposer reads of vLLM's ``InputBatch`` (``vllm/v1/worker/gpu_input_batch.py``);
    tests pass a plain object with the same attributes."""

    @property
    def req_ids(self) -> list[str]:
        """[rows] the request id each row holds."""
        ...

    @property
    def spec_token_ids(self) -> list[list[int]]:
        """[rows][verified] the draft tokens scheduled for each row's last step."""
        ...

    @property
    def num_tokens_no_spec(self) -> npt.NDArray[Any]:
        """[max rows] each row's context length: prompt and kept output, no draft."""
        ...

    @property
    def token_ids_cpu(self) -> npt.NDArray[Any]:
        """[max rows, max_model_len] each row's context in its first
        ``num_tokens_no_spec[row]`` entries."""
        ...


@dataclass(frozen=True)
class RowStep:
    """One row's last step, as the request it belongs to saw it (module glossary)."""

    row: int
    request: str
    verified: int
    accepted: int
    kept: tuple[int, ...]
    num_tokens: int  # the context's length after the step

    def context(self, batch: BatchRows) -> Sequence[int]:
        """The request's prompt and output so far: a view into the batch's int32 array
        (read it before vLLM's next step), which drafters index and slice like a list."""
        return cast(Sequence[int], batch.token_ids_cpu[self.row, : self.num_tokens])


def row_steps(batch: BatchRows, sampled: Sequence[Sequence[int]]) -> list[RowStep | None]:
    """[rows] each row's last step; None for a row that kept nothing (a prefill chunk)."""
    if len(sampled) != len(batch.req_ids):
        raise ValueError(
            f"vLLM passed {len(sampled)} rows of sampled tokens for a batch of "
            f"{len(batch.req_ids)} requests"
        )
    steps: list[RowStep | None] = []
    for row, (request, kept) in enumerate(zip(batch.req_ids, sampled, strict=True)):
        if not kept:
            steps.append(None)
            continue
        verified = len(batch.spec_token_ids[row])
        accepted = min(verified, len(kept) - 1) if verified else 0
        num_tokens = int(batch.num_tokens_no_spec[row])
        steps.append(RowStep(row, request, verified, accepted, tuple(kept), num_tokens))
    return steps


S = TypeVar("S")


class RequestTable(Generic[S]):
    """Per-request state keyed by request id, alive as long as vLLM's worker holds the request.

    ``requests`` is the worker's own table of live requests (``GPUModelRunner.requests``:
    id -> its ``CachedRequestState``). It outlives a request's absences from the batch (a
    step the scheduler skipped it, a preemption) and drops the request once it finished.
    The state object is the handle: a request aborted and sent again under the same id
    gets a new one, so it also gets new state here.

    ``open(request, handle)`` makes a request's state; ``close(request, state)`` hears that
    it left (once per state).
    """

    def __init__(self, open: Callable[[str, object], S], close: Callable[[str, S], None]) -> None:
        self._open = open
        self._close = close
        self._states: dict[str, tuple[object, S]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def retire(self, requests: Mapping[str, object]) -> list[str]:
        """Close every request that is no longer in ``requests`` under the same handle;
        their ids, in the order they were opened."""
        gone = [rid for rid, (handle, _) in self._states.items() if requests.get(rid) is not handle]
        for rid in gone:
            _, state = self._states.pop(rid)
            self._close(rid, state)
        return gone

    def get(self, request: str, handle: object) -> S:
        """The state of ``request`` (opened now if new, or if ``handle`` is not the one it
        was opened with: the old state is closed first)."""
        held = self._states.get(request)
        if held is not None and held[0] is handle:
            return held[1]
        if held is not None:
            self._close(request, held[1])
        state = self._open(request, handle)
        self._states[request] = (handle, state)
        return state

    def close_all(self) -> None:
        """Close every request (the engine is shutting down)."""
        self.retire({})
