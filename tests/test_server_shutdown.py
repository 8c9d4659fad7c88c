"""Graceful shutdown of the server (``spectune.server.shutdown``): a real server process on
loopback, requests in flight, streaming and not, then SIGTERM.

With a drain bound long enough, every request gets its full completion; with a short one,
each gets its completion or a clean error in OpenAI's shape (a 503 JSON body, or an
in-band error event then ``[DONE]``), never a broken connection. A request sent while the
server drains gets a 503; the process exits 0, and the trace has an ``end`` event for every
request. A slow scripted drafter makes each step take tens of milliseconds, so a request of
400 tokens runs for many seconds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from spectune.cli import main
from spectune.drafters import pairing
from spectune.drafters.pairing import Loaded
from spectune.models.llama import LlamaLM
from spectune.server import run as server_run
from spectune.server.testing import toy_tokenizer

# The server process: the toy target, a drafter that sleeps 20 ms per proposal, batch 4.
SERVER = """
import sys
from pathlib import Path

import torch

from spectune.drafters.scripted import ScriptedDrafter
from spectune.models.toy import toy_model
from spectune.monitor.trace import TraceWriter
from spectune.server import create_app
from spectune.server.engines import DraftSource, EngineSettings
from spectune.server.run import listen, serve_on
from spectune.server.testing import toy_service, toy_tokenizer

folder, drain_seconds = Path(sys.argv[1]), float(sys.argv[2])
torch.set_num_threads(1)


def slow():
    return ScriptedDrafter(lambda context, k: [7] * k, vocab_size=64, delay=0.02, name="slow")


service = toy_service(
    toy_model(0, scale=3.0),
    toy_tokenizer(folder / "tokenizer"),
    draft=DraftSource(drafters=slow, label="slow"),
    engine=EngineSettings(kind="batch", max_batch=4, capacity=512),
)
trace = TraceWriter(folder / "trace.jsonl")
service.monitor.trace = trace
sock = listen("127.0.0.1", 0)
print(f"PORT {sock.getsockname()[1]}", flush=True)
serve_on(create_app(service), sock, log_level="warning", drain_seconds=drain_seconds)
trace.close()
print("RETURNED", flush=True)
"""

SHORT, LONG = 6, 400  # max_tokens: done in well under a second; many seconds


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    folder: Path
    drain_seconds: float
    stderr: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None  # copies the process's stderr into ``stderr``

    def health(self) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=5)

    def in_server(self) -> int:
        body = self.health().json()
        return int(body["running"] + body["waiting"])

    def trace_events(self) -> list[dict[str, Any]]:
        lines = (self.folder / "trace.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def start(folder: Path, drain_seconds: float) -> Server:
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(folder), str(drain_seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()  # blocks until the port is bound
    assert line.startswith("PORT "), f"the server did not start: {line!r}"
    server = Server(process, f"http://127.0.0.1:{int(line.split()[1])}", folder, drain_seconds)
    # Read stderr as it comes, so the pipe never fills; the drain's log lines land there.
    server.reader = threading.Thread(
        target=server.stderr.extend, args=(process.stderr,), daemon=True
    )
    server.reader.start()
    deadline = time.monotonic() + 120
    while True:
        try:
            if server.health().status_code == 200:
                return server
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and process.poll() is None, "no /health answer"
        time.sleep(0.1)


@pytest.fixture()
def launch(tmp_path: Path) -> Iterator[Callable[[float], Server]]:
    """Starts a server with the given drain bound; kills it at the end if a test left it
    running."""
    started: list[Server] = []

    def launch(drain_seconds: float) -> Server:
        started.append(start(tmp_path, drain_seconds))
        return started[-1]

    yield launch
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
        server.process.wait()
        if server.reader is not None:
            server.reader.join(10)
        for pipe in (server.process.stdout, server.process.stderr):
            assert pipe is not None
            pipe.close()


@dataclass(frozen=True)
class Outcome:
    kind: str  # "completed" or "error"
    status: int
    error: dict[str, Any] | None = None  # OpenAI's error object
    done: bool = False  # a stream ended with [DONE]


def body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "toy",
        "prompt": "w1 w2 w3",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def send(url: str, max_tokens: int, stream: bool) -> Outcome:
    """One request, read to its end: its completion (a finish reason; for a stream, then
    ``[DONE]``) or its error. A broken connection raises (an httpx error)."""
    with httpx.Client(base_url=url, timeout=120) as client:
        if not stream:
            reply = client.post("/v1/completions", json=body(max_tokens, False))
            data = reply.json()
            if reply.status_code == 200:
                assert data["choices"][0]["finish_reason"] in ("length", "stop")
                return Outcome("completed", 200)
            return Outcome("error", reply.status_code, data["error"])
        with client.stream("POST", "/v1/completions", json=body(max_tokens, True)) as reply:
            if reply.status_code != 200:
                reply.read()
                return Outcome("error", reply.status_code, reply.json()["error"])
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
        done = events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in (events[:-1] if done else events)]
        errors = [chunk["error"] for chunk in chunks if "error" in chunk]
        if errors:
            assert len(errors) == 1 and "error" in chunks[-1]  # the error is the last event
            return Outcome("error", 200, errors[0], done)
        assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        return Outcome("completed", 200, None, done)


class InFlight:
    """Requests sent from threads; each one's outcome, or the exception that ended it."""

    def __init__(self, url: str, jobs: list[tuple[int, bool]]) -> None:
        self.outcomes: dict[int, Outcome | BaseException] = {}
        self.threads = [
            threading.Thread(target=self._run, args=(i, url, *job)) for i, job in enumerate(jobs)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, index: int, url: str, max_tokens: int, stream: bool) -> None:
        try:
            self.outcomes[index] = send(url, max_tokens, stream)
        except BaseException as exc:  # recorded: the test fails on it
            self.outcomes[index] = exc

    def join(self, timeout: float) -> dict[int, Outcome]:
        """Each request's outcome; fails on a client still waiting or a broken connection."""
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a client is still waiting for its answer"
        outcomes = {}
        for index, outcome in self.outcomes.items():
            assert isinstance(outcome, Outcome), f"request {index}: {outcome!r}"
            outcomes[index] = outcome
        return outcomes


def wait_in_server(server: Server, count: int) -> None:
    deadline = time.monotonic() + 60
    while server.in_server() < count:
        assert time.monotonic() < deadline, "the requests never reached the server"
        time.sleep(0.02)


def sigterm_and_wait_draining(server: Server) -> None:
    server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while (reply := server.health()).status_code == 200:
        assert time.monotonic() < deadline, "/health never said the server drains"
        time.sleep(0.02)
    assert reply.status_code == 503 and reply.json()["status"] == "draining"


def assert_exits_cleanly(server: Server, within: float) -> None:
    assert server.process.wait(within) == 0
    assert server.process.stdout is not None
    assert server.process.stdout.read().strip() == "RETURNED"  # serve_on returned
    assert server.reader is not None
    server.reader.join(10)  # the whole log is in ``stderr`` now


def assert_trace_ends_every_request(server: Server, expected: int) -> list[dict[str, Any]]:
    """Each request that started in the trace has exactly one ``end`` event; the ends."""
    events = server.trace_events()
    started = [e["request"] for e in events if e["event"] == "request"]
    ends = [e for e in events if e["event"] == "end"]
    assert len(started) == expected
    assert sorted(e["request"] for e in ends) == sorted(started)
    return ends


@pytest.mark.slow  # seconds: the quick loop (-m 'not slow') stays under 3 minutes
def test_a_long_drain_finishes_every_request(launch: Callable[[float], Server]) -> None:
    server = launch(120)
    # Four rows busy for a few seconds each: two streamed, two not.
    jobs = [(60, True), (60, False), (40, True), (40, False)]
    with httpx.Client(base_url=server.url, timeout=10) as kept:  # a connection kept alive
        assert kept.post("/v1/completions", json=body(SHORT, False)).status_code == 200
        flight = InFlight(server.url, jobs)
        wait_in_server(server, len(jobs))
        sigterm_and_wait_draining(server)
        # A new request while the server drains, on a new connection or the kept one: a
        # 503 in OpenAI's shape, which the openai client raises.
        fresh = httpx.post(server.url + "/v1/completions", json=body(SHORT, False), timeout=10)
        again = kept.post("/v1/completions", json=body(SHORT, True))
    for refused in (fresh, again):
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
    with (
        openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client,
        pytest.raises(openai.InternalServerError, match="shutting down"),
    ):
        client.completions.create(model="toy", prompt="w1", max_tokens=SHORT)

    outcomes = flight.join(120)
    assert [o.kind for o in outcomes.values()] == ["completed"] * len(jobs), outcomes
    assert all(o.done for i, o in outcomes.items() if jobs[i][1])  # streams end with [DONE]
    assert_exits_cleanly(server, within=30)
    ends = assert_trace_ends_every_request(server, len(jobs) + 1)
    assert not any(e["cancelled"] for e in ends)
    log = "".join(server.stderr)
    assert "draining 4 requests, up to 120 s" in log and "drained: 4 requests finished" in log


def test_a_short_drain_cancels_the_rest_cleanly(launch: Callable[[float], Server]) -> None:
    drain = 1.0
    server = launch(drain)
    # Two requests that may finish within the bound, two that cannot; streamed and not.
    jobs = [(LONG, True), (LONG, False), (SHORT, True), (SHORT, False)]
    flight = InFlight(server.url, jobs[:2])
    wait_in_server(server, 2)
    also = InFlight(server.url, jobs[2:])
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)

    outcomes = {**flight.join(60), **{i + 2: o for i, o in also.join(60).items()}}
    for index, outcome in outcomes.items():
        if outcome.kind == "completed":
            continue
        assert outcome.error is not None and outcome.error["code"] == "server_shutting_down"
        assert outcome.error["type"] == "server_error"
        if jobs[index][1] and outcome.status == 200:
            assert outcome.done  # the in-band error, then [DONE]
        else:
            assert outcome.status == 503
    for index in (0, 1):  # the long ones were cut
        cut = outcomes[index].error
        assert cut is not None and "did not finish within the 1 s drain bound" in cut["message"]

    assert_exits_cleanly(server, within=drain + 15)
    print(f"exited {time.monotonic() - signalled:.1f} s after SIGTERM")  # with -s
    started = sum(1 for e in server.trace_events() if e["event"] == "request")
    ends = assert_trace_ends_every_request(server, started)  # refused ones never start
    assert sum(e["cancelled"] for e in ends) >= 2
    log = "".join(server.stderr)
    assert "cancelled" in log and "after the 1 s drain bound" in log


@pytest.mark.slow  # seconds: the quick loop (-m 'not slow') stays under 3 minutes
def test_a_second_signal_cuts_the_drain_short(launch: Callable[[float], Server]) -> None:
    server = launch(120)
    flight = InFlight(server.url, [(LONG, True), (LONG, False)])
    wait_in_server(server, 2)
    sigterm_and_wait_draining(server)
    server.process.send_signal(signal.SIGINT)
    outcomes = flight.join(60)
    for outcome in outcomes.values():
        assert outcome.kind == "error", outcomes
        assert outcome.error is not None and outcome.error["code"] == "server_shutting_down"
    assert_exits_cleanly(server, within=30)
    assert_trace_ends_every_request(server, 2)
    assert "cancelled 2 requests on a second signal" in "".join(server.stderr)


def test_an_idle_server_exits_at_once(launch: Callable[[float], Server]) -> None:
    server = launch(120)
    server.process.send_signal(signal.SIGINT)
    assert_exits_cleanly(server, within=20)
    assert "no requests in flight" in "".join(server.stderr)


def test_serve_passes_its_drain_bound(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    toy_target: LlamaLM,
) -> None:
    loaded = Loaded(toy_target, toy_tokenizer(tmp_path / "tokenizer"), tmp_path / "toy.gguf")
    # the command line looks the loader up when it runs
    monkeypatch.setattr(pairing, "load_target", lambda ref, **kw: loaded)
    real_listen = server_run.listen
    monkeypatch.setattr(server_run, "listen", lambda host, port: real_listen("127.0.0.1", 0))
    seen: dict[str, Any] = {}
    monkeypatch.setattr(server_run, "serve_on", lambda app, sock, **kw: seen.update(kw))
    args = ["serve", "--engine", "sequential", "--draft", "none"]
    assert main([*args, "--drain-seconds", "3.5"]) == 0
    assert seen["drain_seconds"] == 3.5
    assert main(args) == 0
    assert seen["drain_seconds"] == server_run.DRAIN_SECONDS
    for bad in ("-1", "inf", "nan"):
        seen.clear()
        assert main([*args, "--drain-seconds", bad]) == 2
        assert "--drain-seconds must be" in capsys.readouterr().err
        assert not seen
