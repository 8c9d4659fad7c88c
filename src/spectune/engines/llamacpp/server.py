"""A ``llama-server`` (llama.cpp's HTTP server) on a free loopback port, and one request to it.

``llama_server`` starts the binary with ``--metrics`` and one slot (``--parallel 1``), polls
``GET /health`` until it answers 200 (or the process dies: ``LlamaServerError`` with the last
lines of its log), yields its URL and stops it on the way out. ``ServerPool`` holds one
server per flag set (``Candidate``), all started before anything is timed. ``replay_one``
sends one greedy chat completion and reads llama.cpp's own draft counts from the response's
``timings``. Which binary: ``$LLAMA_SERVER``, else ``llama-server`` on PATH, else the one
``scripts/build-llama-server.sh`` builds (``default_server_binary``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from spectune.engines.process import free_port
from spectune.errors import SpectuneError
from spectune.prompts import EvalPrompt

__all__ = [
    "BUILT_BINARY",
    "Candidate",
    "LlamaServerError",
    "Measured",
    "ServerPool",
    "default_server_binary",
    "llama_server",
    "replay_one",
]

BUILT_BINARY = Path("build/llama.cpp/cmake/bin/llama-server")  # scripts/build-llama-server.sh


class LlamaServerError(SpectuneError):
    """A ``llama-server`` did not start, died, or answered something other than a completion."""


def default_server_binary() -> Path | None:
    """``$LLAMA_SERVER``, else ``llama-server`` on PATH, else the one the build script made."""
    named = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if named:
        return Path(named)
    return BUILT_BINARY if BUILT_BINARY.is_file() else None


@dataclass(frozen=True)
class Candidate:
    """One configuration: its name in the report and its ``llama-server`` flags."""

    name: str
    args: tuple[str, ...]


@contextmanager
def llama_server(
    binary: Path,
    model: Path,
    args: Sequence[str],
    *,
    threads: int,
    context: int = 2048,
    extra: Sequence[str] = (),
    ready_within: float = 120.0,
) -> Iterator[str]:
    """A ``llama-server`` on a free local port, serving until the block ends; yields its
    URL once ``/health`` answers 200. Its log is kept for the error when it dies."""
    port = free_port()
    command = [
        str(binary),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--ctx-size",
        str(context),
        "--parallel",
        "1",
        "--metrics",
        *args,
        *extra,
    ]
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    except OSError as exc:  # not a program this machine can run (a script without #!, ...)
        raise LlamaServerError(f"cannot start {binary}: {exc.strerror or exc}") from exc
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within
        while True:
            if process.poll() is not None:
                log = process.stderr.read() if process.stderr else ""
                lines = [line for line in log.splitlines() if line.strip()][-3:]
                flags = " ".join(args) or "no speculation flags"
                raise LlamaServerError(
                    f"llama-server exited ({process.returncode}) with {flags}: " + " | ".join(lines)
                )
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise LlamaServerError(f"llama-server not ready after {ready_within:.0f} s")
            time.sleep(0.1)  # a readiness poll, not a timing
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


class ServerPool:
    """One running ``llama-server`` per candidate, all started before anything is timed."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        candidates: Sequence[Candidate],
        *,
        threads: int,
        context: int = 2048,
        on_start: Callable[[Candidate], None] | None = None,
    ) -> None:
        self.binary, self.model, self.threads, self.context = binary, model, threads, context
        self.candidates = list(candidates)
        self.urls: dict[str, str] = {}
        self._stack = ExitStack()
        self._on_start = on_start

    def __enter__(self) -> ServerPool:
        try:
            for candidate in self.candidates:
                if self._on_start is not None:
                    self._on_start(candidate)
                self.urls[candidate.name] = self._stack.enter_context(
                    llama_server(
                        self.binary,
                        self.model,
                        candidate.args,
                        threads=self.threads,
                        context=self.context,
                    )
                )
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


@dataclass(frozen=True)
class Measured:
    """One request: completion tokens, the client's wall-clock seconds, the server's own
    generation time, and its draft counts (``timings.draft_n`` / ``draft_n_accepted``)."""

    tokens: int
    seconds: float
    generation_seconds: float
    drafted: int
    accepted: int
    text: str


def replay_one(url: str, prompt: EvalPrompt, max_tokens: int) -> Measured:
    """One chat completion, greedy, exactly ``max_tokens`` tokens (end-of-text ignored, so
    every configuration decodes the same number of tokens)."""
    body = {
        "messages": [dict(m) for m in prompt.messages],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "seed": 0,
    }
    start = time.perf_counter()
    try:
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    except httpx.HTTPError as exc:
        raise LlamaServerError(f"{url}: {exc}") from None
    seconds = time.perf_counter() - start
    if reply.status_code != 200:
        raise LlamaServerError(f"{url}: HTTP {reply.status_code}: {reply.text[:200]}")
    data: dict[str, Any] = reply.json()
    timings = data.get("timings", {})
    usage = data.get("usage", {})
    return Measured(
        tokens=int(usage.get("completion_tokens", 0)),
        seconds=seconds,
        generation_seconds=float(timings.get("predicted_ms", 0.0)) / 1000,
        drafted=int(timings.get("draft_n", 0)),
        accepted=int(timings.get("draft_n_accepted", 0)),
        text=str(data["choices"][0]["message"]["content"]),
    )
