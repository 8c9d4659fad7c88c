"""Continuous batching: one thread owns the batch engine and steps it; requests come and go.

Requests are submitted from the event loop, wait in a bounded queue, join the running
batch when it has room and leave it when they finish or are cancelled, always between
two steps. Only the scheduler thread touches the engine, so the engine needs no locks.
Each step's updates are handed to per-request sinks (asyncio queues fed thread-safely).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch

from spectune.control.base import KPolicy
from spectune.records import StepRecord, StopCondition
from spectune.sampling import SamplingParams

__all__ = [
    "AsyncSink",
    "AdmitChoice",
    "QueueFull",
    "RequestPolicies",
    "Scheduler",
    "StepEngine",
    "Submission",
    "Update",
    "UpdateSink",
]

log = logging.getLogger(__name__)


class Update(Protocol):
    @property
    def request_id(self) -> str: ...

    @property
    def record(self) -> StepRecord: ...


class StepEngine(Protocol):
    """What the scheduler needs of a batch engine (``spectune.decode.batch.BatchEngine``)."""

    @property
    def active(self) -> int: ...

    @property
    def has_room(self) -> bool: ...

    def add(
        self,
        request_id: str,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        stop: StopCondition | None = None,
        policy: KPolicy | None = None,
    ) -> None:
        """``BatchFullError`` when full, ``InvalidParameterError`` for an id already
        active, ``PromptError`` for a bad prompt; ``policy`` overrides the engine's own."""
        ...

    def cancel(self, request_id: str) -> None: ...

    def step(self) -> Sequence[Update]: ...


class UpdateSink(Protocol):
    """Where one request's updates go. Called from the scheduler thread."""

    def deliver(self, update: Update) -> None: ...

    def fail(self, error: BaseException) -> None: ...


@dataclass(frozen=True)
class Submission:
    request_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    sink: UpdateSink
    policy: KPolicy | None = None  # None: the engine's default policy
    tenant: str | None = None  # the API key's holder (None: no keys)


T = TypeVar("T")


class AdmitChoice(Generic[T]):
    """Something of the request being added that a factory of the engine reads inside
    ``add``: the scheduler (one thread, one ``add`` at a time) names it with ``choosing``
    around the call; ``chosen`` is None outside one."""

    def __init__(self) -> None:
        self.chosen: T | None = None

    @contextmanager
    def choosing(self, value: T | None) -> Iterator[None]:
        self.chosen = value
        try:
            yield
        finally:
            self.chosen = None


class RequestPolicies(AdmitChoice[KPolicy]):
    """A ``policy_factory`` for batch engines whose ``add`` takes no policy: the policy the
    scheduler names with ``choosing``; requests that name none get ``default(params)``."""

    def __init__(self, default: Callable[[SamplingParams], KPolicy]) -> None:
        super().__init__()
        self.default = default

    def __call__(self, params: SamplingParams) -> KPolicy:
        policy, self.chosen = self.chosen, None
        return policy if policy is not None else self.default(params)


class QueueFull(Exception):
    """Running plus waiting requests are at the limit; the client should retry later."""


class Scheduler:
    """Steps ``engine`` in a background thread while any request is running.

    ``max_requests`` bounds running plus waiting requests (``submit`` raises ``QueueFull``
    beyond it). ``on_step(batch_size, seconds)`` is called after every step, for metrics.
    Per-request K policies reach the engine through ``add(policy=...)`` when it takes one,
    else through ``policies`` (the ``RequestPolicies`` the engine was built with); each
    request's tenant through ``tenants`` (the engine's drafter factory reads it).
    """

    def __init__(
        self,
        engine: StepEngine,
        *,
        max_requests: int = 64,
        on_step: Callable[[int, float], None] | None = None,
        policies: RequestPolicies | None = None,
        tenants: AdmitChoice[str] | None = None,
    ) -> None:
        self.engine = engine
        self.policies = policies
        self.tenants = tenants
        self.max_requests = max_requests
        self.on_step = on_step
        self._add_takes_policy = "policy" in inspect.signature(engine.add).parameters
        self.accepts_policy = self._add_takes_policy or policies is not None
        self._wakeup = threading.Condition()
        self._waiting: deque[Submission] = deque()
        self._cancels: set[str] = set()
        self._sinks: dict[str, UpdateSink] = {}  # running requests, scheduler thread only
        self._running = 0  # len(self._sinks), readable from any thread
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- called from the event loop ------------------------------------------------------

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, submission: Submission) -> None:
        if submission.policy is not None and not self.accepts_policy:
            raise ValueError("this batch engine does not take per-request K policies")
        with self._wakeup:
            if self._running + len(self._waiting) >= self.max_requests:
                raise QueueFull(f"{self.max_requests} requests are already running or waiting")
            self._waiting.append(submission)
            self._wakeup.notify()

    def cancel(self, request_id: str) -> None:
        """Stop a request between steps and free its cache row. Idempotent."""
        with self._wakeup:
            self._cancels.add(request_id)
            self._wakeup.notify()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="spectune-scheduler", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- the scheduler thread ------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not (self._stopping or self._waiting or self._cancels or self._sinks):
                    self._wakeup.wait()
                if self._stopping:
                    break
                cancels, self._cancels = self._cancels, set()
                # Cancelled requests that never started leave the queue here.
                self._waiting = deque(s for s in self._waiting if s.request_id not in cancels)
            try:
                self._iteration(cancels)
            except Exception as exc:
                # A bug here must not leave requests waiting forever on a dead thread:
                # fail the running ones, free their rows and keep serving.
                log.exception("scheduler iteration failed; failing the running requests")
                self._fail_running(exc)
        self._shutdown()

    def _iteration(self, cancels: set[str]) -> None:
        # 1. Cancellations free their rows before new requests take them.
        for request_id in cancels:
            if self._sinks.pop(request_id, None) is not None:
                self.engine.cancel(request_id)
        self._running = len(self._sinks)
        # 2. Admissions, oldest first, while the batch has room.
        while self.engine.has_room:
            with self._wakeup:
                if not self._waiting:
                    break
                submission = self._waiting.popleft()
                self._running += 1  # keeps submit's count exact while it is being added
            self._admit(submission)
            self._running = len(self._sinks)
        # 3. One step over the running batch.
        if self._sinks:
            self._step()
        self._running = len(self._sinks)

    def _fail_running(self, error: BaseException) -> None:
        for request_id, sink in list(self._sinks.items()):
            try:
                self.engine.cancel(request_id)
            except Exception:  # the engine is already in trouble; the row is lost either way
                log.exception("cancelling %s failed", request_id)
            sink.fail(error)
        self._sinks.clear()
        self._running = 0

    @property
    def alive(self) -> bool:
        """The scheduler thread is running (what ``/health`` reports)."""
        return self._thread is not None and self._thread.is_alive()

    def _admit(self, submission: Submission) -> None:
        generator = None
        if submission.params.seed is not None:
            generator = torch.Generator().manual_seed(submission.params.seed)
        tenant = nullcontext() if self.tenants is None else self.tenants.choosing(submission.tenant)
        try:
            with tenant:
                self._add(submission, generator)
        except Exception as exc:  # a bad request fails alone; the batch goes on
            submission.sink.fail(exc)
            return
        self._sinks[submission.request_id] = submission.sink

    def _add(self, submission: Submission, generator: torch.Generator | None) -> None:
        request_id, prompt, params = submission.request_id, submission.prompt, submission.params
        if submission.policy is not None and self._add_takes_policy:
            self.engine.add(
                request_id, prompt, params, generator=generator, policy=submission.policy
            )
        elif submission.policy is not None and self.policies is not None:
            with self.policies.choosing(submission.policy):
                self.engine.add(request_id, prompt, params, generator=generator)
        else:
            self.engine.add(request_id, prompt, params, generator=generator)

    def _step(self) -> None:
        batch_size = len(self._sinks)
        start = time.perf_counter()
        failures: dict[str, BaseException] = {}
        try:
            updates: Sequence[Update] = self.engine.step()
        except Exception as exc:
            # An engine that reports per-request failures (``SequenceFailed``) keeps the
            # rest of its batch; any other error leaves the batch in an unknown state, so
            # every running request fails and its row is freed.
            per_request = getattr(exc, "failures", None)
            if isinstance(per_request, dict):
                failures = per_request
                updates = getattr(exc, "updates", [])
            else:
                log.exception("batch step failed; failing %d running requests", batch_size)
                failures = dict.fromkeys(self._sinks, exc)
                updates = []
                for request_id in failures:
                    self.engine.cancel(request_id)
        if self.on_step is not None:
            self.on_step(batch_size, time.perf_counter() - start)
        for update in updates:
            sink = self._sinks.get(update.request_id)
            if sink is None:
                continue  # cancelled meanwhile
            sink.deliver(update)
            if update.record.finish_reason is not None:
                del self._sinks[update.request_id]
        for request_id, error in failures.items():
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                sink.fail(error)

    def _shutdown(self) -> None:
        error = RuntimeError("the server is shutting down")
        self._fail_running(error)
        with self._wakeup:
            waiting, self._waiting = self._waiting, deque()
        for submission in waiting:
            submission.sink.fail(error)
        self._running = 0


class AsyncSink:
    """An ``UpdateSink`` that feeds an asyncio queue on ``loop`` from the scheduler thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Update | BaseException] = asyncio.Queue()

    def deliver(self, update: Update) -> None:
        self._put(update)

    def fail(self, error: BaseException) -> None:
        self._put(error)

    def _put(self, item: Update | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass  # the loop has closed: nobody is listening any more

    async def next(self) -> Update:
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item
