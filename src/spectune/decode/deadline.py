"""Calls that may hang, run with a deadline: the batch engine's draft pass.

``DeadlineCall.run(fn)`` runs ``fn`` in a daemon worker thread and waits at most
``seconds``. Past the deadline it raises ``DeadlineExceeded`` and leaves the call running
(a Python thread cannot be killed); ``busy`` then says so until it returns, and the
caller must not touch what the call uses meanwhile. A daemon thread never holds up the
process's exit. The cost is a hand-over between two threads per call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from spectune.errors import InvalidParameterError

__all__ = ["DeadlineCall", "DeadlineExceeded"]

T = TypeVar("T")
IDLE_SECONDS = 30.0  # the worker thread leaves after this long without a call


class DeadlineExceeded(Exception):
    """The call did not return within its deadline (it may still be running)."""


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class DeadlineCall:
    """Runs calls in a worker thread, waiting at most ``seconds`` for each."""

    def __init__(self, seconds: float, name: str = "spectune-deadline") -> None:
        if not 0 < seconds < float("inf"):
            raise InvalidParameterError(f"a deadline must be a positive number, got {seconds}")
        self.seconds = seconds
        self.name = name
        self._jobs: queue.Queue[tuple[Callable[[], Any], _Outcome[Any]]] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._late: _Outcome[Any] | None = None  # a call past its deadline

    @property
    def busy(self) -> bool:
        """A call that passed its deadline is still running."""
        return self._late is not None and not self._late.done.is_set()

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()``, or ``DeadlineExceeded`` after ``seconds``; ``fn``'s errors propagate."""
        if self.busy:
            raise DeadlineExceeded("the previous call is still running past its deadline")
        outcome: _Outcome[T] = _Outcome()
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._worker.start()
            self._jobs.put((fn, outcome))
        if not outcome.done.wait(self.seconds):
            self._late = outcome
            raise DeadlineExceeded(f"no answer within {self.seconds:g} s")
        if outcome.error is not None:
            raise outcome.error
        return outcome.value  # type: ignore[return-value]  # set when no error was raised

    def _serve(self) -> None:
        """The worker: one long-lived thread (a fresh thread per call would also start a
        fresh OpenMP team for torch each time); it leaves after ``IDLE_SECONDS`` idle."""
        while True:
            try:
                fn, outcome = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # run() puts under the lock: nothing is lost
                        self._worker = None
                        return
                continue
            try:
                outcome.value = fn()
            except BaseException as exc:  # handed to the caller's thread
                outcome.error = exc
            finally:
                outcome.done.set()
