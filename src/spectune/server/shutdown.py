"""The server's graceful shutdown, on SIGTERM or SIGINT (Ctrl-C):

1. Drain: the listener stays open, but new requests get a 503 in OpenAI's error shape
   ("the server is shutting down") and ``/health`` turns 503, so a load balancer or proxy
   gets an answer it can retry elsewhere, never a refused or reset connection. Requests in
   flight go on, for up to ``drain_seconds``.
2. Cancel: what is still running then (or at once, on a second signal) ends with a 503
   error: a JSON error body, or an in-band error event and ``[DONE]`` for a stream. Its
   trace gets its ``end`` event, marked cancelled.
3. Exit: uvicorn closes the listener and the idle connections, gives the last responses
   ``FLUSH_SECONDS`` to be written, stops the scheduler, and ``serve`` returns, so the
   command exits 0 (uvicorn on its own re-raises the signal, which ends in status 143).

Each step is logged to stderr ("draining 4 requests, up to 25 s"; "cancelled 2 requests
after the 25 s drain bound").
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn
from fastapi import FastAPI

from spectune.errors import SpectuneError
from spectune.server.service import Service

__all__ = ["FLUSH_SECONDS", "DrainingServer", "serve"]

FLUSH_SECONDS = 5  # after the drain, for the last responses to be written
POLL_SECONDS = 0.05  # how often the drain looks at the requests in flight


def serve(app: FastAPI, sock: socket.socket, *, log_level: str, drain_seconds: float) -> None:
    """Serve ``app`` (its ``state.service``) on the bound ``sock`` until SIGINT or SIGTERM,
    then shut down as the module docstring says, and return."""
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=FLUSH_SECONDS)
    server = DrainingServer(config, app.state.service, drain_seconds)
    server.run(sockets=[sock])
    if not server.started:  # uvicorn logged why (e.g. the app's startup failed)
        raise SpectuneError("the server did not start (see the log above)")


def _say(line: str) -> None:
    print(f"spectune: {line}", file=sys.stderr, flush=True)


def _requests(n: int) -> str:
    return f"{n} request" + ("" if n == 1 else "s")


class DrainingServer(uvicorn.Server):
    """uvicorn's server with steps 1 and 2 of the module docstring run between the signal
    and uvicorn's own shutdown (step 3, which closes the listener)."""

    def __init__(
        self,
        config: uvicorn.Config,
        service: Service,
        drain_seconds: float,
        say: Callable[[str], None] = _say,
    ) -> None:
        super().__init__(config)
        self.service = service
        self.drain_seconds = drain_seconds
        self.say = say
        self.signals = 0  # SIGINT or SIGTERM received; a second one cuts the drain short

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM start the shutdown. Unlike uvicorn's own handlers, these do
        not re-raise the signal at the end: a server that shut down cleanly exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only (a server run in a test's thread)
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        self.should_exit = True  # ends uvicorn's main loop; ``main_loop`` then drains

    async def main_loop(self) -> None:
        await super().main_loop()
        await self.drain()

    async def drain(self) -> None:
        """Drain, then cancel what is left; the listener stays open throughout."""
        service = self.service
        service.drain()
        bound = self.drain_seconds
        pending = service.in_flight
        if not pending:
            self.say("shutting down: no requests in flight")
            return
        self.say(f"shutting down: draining {_requests(pending)}, up to {bound:g} s")
        deadline = time.monotonic() + bound
        while service.in_flight and time.monotonic() < deadline and self.signals < 2:
            await asyncio.sleep(POLL_SECONDS)
        if not service.in_flight:
            self.say(f"drained: {_requests(pending)} finished")
            return
        if self.signals < 2:
            why = f"after the {bound:g} s drain bound"
            reason = f"the request did not finish within the {bound:g} s drain bound"
        else:
            why = "on a second signal"
            reason = "the request was cancelled before it finished"
        cancelled = service.cancel_all(f"the server is shutting down: {reason}")
        # The streams raise at their next read, on this loop: a moment, whatever the engine
        # is doing. Bounded all the same: uvicorn closes whatever is left after it.
        deadline = time.monotonic() + FLUSH_SECONDS
        while service.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
        self.say(f"cancelled {_requests(cancelled)} {why}")
