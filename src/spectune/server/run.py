"""Serving an app on a socket: binding with one-line errors, and uvicorn with a bounded
graceful shutdown. Shared by ``spectune serve`` and the soak test's server."""

from __future__ import annotations

import socket

from fastapi import FastAPI

from spectune.errors import InvalidParameterError, SpectuneError

__all__ = ["GRACEFUL_SHUTDOWN_SECONDS", "listen", "serve_on"]

GRACEFUL_SHUTDOWN_SECONDS = 30  # how long requests in flight may finish after a SIGTERM


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


def serve_on(
    app: FastAPI,
    sock: socket.socket,
    *,
    log_level: str = "info",
    graceful_seconds: int = GRACEFUL_SHUTDOWN_SECONDS,
) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGINT or SIGTERM.

    On either signal uvicorn stops accepting connections at once, lets the requests in
    flight finish for up to ``graceful_seconds``, then closes the rest; the
    scheduler then fails whatever is left with "the server is shutting down".
    """
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_seconds)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if not server.started:  # uvicorn logged why (e.g. the app's startup failed)
        raise SpectuneError("the server did not start (see the log above)")
