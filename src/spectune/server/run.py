"""Serving an app on a socket: binding with one-line errors, and uvicorn with a graceful
shutdown (``spectune.server.shutdown``). Shared by ``spectune serve`` and the soak test's
server. Light to import (no uvicorn, no FastAPI): ``spectune serve`` reads its defaults and
checks its flags with it before anything heavy loads."""

from __future__ import annotations

import math
import socket
from typing import TYPE_CHECKING

from spectune.errors import InvalidParameterError

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["DRAIN_SECONDS", "LISTEN_BACKLOG", "check_drain_seconds", "listen", "serve_on"]

# Kubernetes sends SIGKILL 30 s after SIGTERM unless told otherwise: 25 s of drain leaves
# time to answer what is left with an error and exit before that.
DRAIN_SECONDS = 25.0
LISTEN_BACKLOG = 2048  # uvicorn's default backlog


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, or a one-line error: bound before the models load,
    so a bad address or a port in use fails in a second, not after the loading."""
    if not 0 <= port <= 65535:
        raise InvalidParameterError(f"--port must be in [0, 65535], got {port}")
    if not host.strip():
        raise InvalidParameterError("--host must be an address or a host name (e.g. 127.0.0.1)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise InvalidParameterError(f"--host {host!r} is not an address here: {reason}") from None
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a restart may bind while old connections linger in TIME_WAIT
        # (never while another server listens there).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise InvalidParameterError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def check_drain_seconds(seconds: float) -> float:
    """``seconds`` if it can bound a drain (finite, >= 0), else a one-line error."""
    if not 0 <= seconds < math.inf:
        raise InvalidParameterError(
            f"--drain-seconds must be a number of seconds >= 0, got {seconds:g}"
        )
    return seconds


def serve_on(
    app: FastAPI,
    sock: socket.socket,
    *,
    log_level: str = "info",
    drain_seconds: float = DRAIN_SECONDS,
) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGINT or SIGTERM, drain and return
    (``spectune.server.shutdown``)."""
    from spectune.server.shutdown import serve

    serve(app, sock, log_level=log_level, drain_seconds=check_drain_seconds(drain_seconds))
