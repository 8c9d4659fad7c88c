"""Calls that may hang, run with a deadline: the batch engine's draft pass.

``DeadlineCall.run(fn)`` runs ``fn`` in a fresh daemon thread and waits at most
``seconds``. Past the deadline it raises ``DeadlineExceeded`` and leaves the call running
(a Python thread cannot be killed); ``busy`` then says so until it returns, and the
caller must not touch what the call uses meanwhile. A daemon thread never holds up the
process's exit. The cost is one thread start per call (tens of microseconds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from spectune.errors import InvalidParameterError

__all__ = ["DeadlineCall", "DeadlineExceeded"]

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The call did not return within its deadline (it may still be running)."""


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class DeadlineCall:
    """Runs calls in daemon threads, waiting at most ``seconds`` for each."""

    def __init__(self, seconds: float, name: str = "spectune-deadline") -> None:
        if not 0 < seconds < float("inf"):
            raise InvalidParameterError(f"a deadline must be a positive number, got {seconds}")
        self.seconds = seconds
        self.name = name
        self._late: threading.Thread | None = None  # a call past its deadline

    @property
    def busy(self) -> bool:
        """A call that passed its deadline is still running."""
        return self._late is not None and self._late.is_alive()

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()``, or ``DeadlineExceeded`` after ``seconds``; ``fn``'s errors propagate."""
        if self.busy:
            raise DeadlineExceeded("the previous call is still running past its deadline")
        outcome: _Outcome[T] = _Outcome()

        def target() -> None:
            try:
                outcome.value = fn()
            except BaseException as exc:  # handed to the caller's thread
                outcome.error = exc
            finally:
                outcome.done.set()

        thread = threading.Thread(target=target, name=self.name, daemon=True)
        thread.start()
        if not outcome.done.wait(self.seconds):
            self._late = thread
            raise DeadlineExceeded(f"no answer within {self.seconds:g} s")
        if outcome.error is not None:
            raise outcome.error
        return outcome.value  # type: ignore[return-value]  # set when no error was raised
