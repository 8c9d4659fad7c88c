"""A server process on a free loopback port: started, waited for, stopped.

``served_process`` starts a command in its own process group with its output streamed to a
log file, polls a health URL until it answers 200 (or the process dies, or the wait times
out: one-line ``EngineStartError`` naming the log and its last lines), yields, and on the
way out stops the whole group: SIGTERM, then SIGKILL after a grace period. The group
matters: vLLM's API server runs its engine in a child process, which must not outlive it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from spectune.errors import SpectuneError

__all__ = ["EngineStartError", "free_port", "served_process"]

STOP_GRACE = 30.0  # seconds between SIGTERM and SIGKILL


class EngineStartError(SpectuneError):
    """A server process exited, or did not answer its health check in time."""


def free_port() -> int:
    """A loopback port nothing listens on now (another process may take it before use)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:])


@contextmanager
def served_process(
    command: Sequence[str],
    *,
    health_url: str,
    log: Path,
    name: str,
    env: Mapping[str, str] | None = None,
    ready_within: float = 300.0,
) -> Iterator[None]:
    """Run ``command`` until the block ends; enter the block once ``health_url`` answers
    200. Its stdout and stderr go to ``log`` (appended as they come)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,  # its own process group: stopped as one below
        )
    try:
        deadline = time.monotonic() + ready_within
        while True:
            if process.poll() is not None:
                raise EngineStartError(
                    f"{name} exited ({process.returncode}) before it was ready; log {log}: "
                    + _tail(log)
                )
            try:
                if httpx.get(health_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EngineStartError(
                    f"{name} not ready after {ready_within:.0f} s; log {log}: " + _tail(log)
                )
            time.sleep(0.5)  # a readiness poll, not a timing
        yield
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group; SIGKILL to what is left of it ``STOP_GRACE`` s later."""
    _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while time.monotonic() < deadline:
        process.poll()  # reap the leader, so that only live members answer signal 0
        if not _signal_group(process.pid, 0):
            break
        time.sleep(0.2)
    else:
        _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to group ``pgid`` (0: only check it); False when no member is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True
