"""Abandoned requests: a client that goes away, streaming or not, has its request stopped
at the next step and its batch row freed; /metrics and the trace count it as cancelled.

A real uvicorn server on loopback and a real HTTP client that gives up (a read timeout
closes its connection). A slow scripted drafter makes every step take tens of
milliseconds, so a request of 400 tokens would hold its row for many seconds."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import torch

from spectune.drafters.scripted import ScriptedDrafter
from spectune.models.llama import LlamaLM
from spectune.monitor.trace import TraceWriter, read_trace
from spectune.server import create_app
from spectune.server.engines import DraftSource, EngineSettings
from spectune.server.service import Service
from spectune.server.testing import running_server, toy_service, toy_tokenizer

FREED_WITHIN = 2.0  # seconds from the client's disconnect to a free row
STEP_DELAY = 0.02  # seconds the drafter sleeps per proposal


def slow_drafter() -> ScriptedDrafter:
    def script(context: Sequence[int], k: int) -> list[int]:
        return [7] * k

    return ScriptedDrafter(script, vocab_size=64, delay=STEP_DELAY, name="slow")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """As in test_server_load: on a shared, oversubscribed machine torch's spinning
    intra-op workers slow every step down tenfold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def server(toy_target: LlamaLM, tmp_path: Path) -> Iterator[tuple[str, Service, Path]]:
    service = toy_service(
        toy_target,
        toy_tokenizer(tmp_path / "tokenizer"),
        draft=DraftSource(drafters=slow_drafter, label="slow"),
        engine=EngineSettings(kind="batch", max_batch=4, capacity=512),
    )
    trace = tmp_path / "trace.jsonl"
    service.monitor.trace = TraceWriter(trace)
    with running_server(create_app(service)) as url:
        yield url, service, trace
    service.monitor.trace.close()


def freed_after(service: Service, since: float) -> float:
    """Seconds from ``since`` until no request runs or waits (fails past 10 s)."""
    while service.scheduler.running or service.scheduler.waiting:
        assert time.monotonic() - since < 10, "the abandoned request still holds its row"
        time.sleep(0.02)
    return time.monotonic() - since


def trace_ends(trace: Path) -> list[bool]:
    """The ``cancelled`` flag of each request's end event (a request cancelled before its
    first step has no steps, which ``read_trace`` refuses as a trace)."""
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    return [e["cancelled"] for e in events if e["event"] == "end"]


def cancelled_total(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("spectune_cancelled_requests_total"))
    return float(line.split()[-1])


BODY = {
    "model": "toy",
    "messages": [{"role": "user", "content": "w1 w2 w3"}],
    "max_tokens": 400,
    "temperature": 0,
}


def assert_cancelled(url: str, service: Service, trace: Path, gone: float, count: int = 1) -> None:
    """Every row is free within ``FREED_WITHIN`` of ``gone``; /metrics and the trace count
    ``count`` cancelled requests."""
    freed = freed_after(service, gone)
    print(f"rows freed {freed:.2f} s after the client left")  # the figure, with -s
    assert freed < FREED_WITHIN
    assert cancelled_total(url) == count
    assert trace_ends(trace) == [True] * count


def test_non_streaming_request_abandoned_frees_its_row(
    server: tuple[str, Service, Path],
) -> None:
    url, service, trace = server
    with httpx.Client(timeout=1.5) as client, pytest.raises(httpx.ReadTimeout):
        client.post(url + "/v1/chat/completions", json=BODY)
    gone = time.monotonic()  # the client closed its connection on the timeout
    assert_cancelled(url, service, trace, gone)


def test_streaming_request_abandoned_frees_its_row(server: tuple[str, Service, Path]) -> None:
    url, service, trace = server
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST", url + "/v1/chat/completions", json={**BODY, "stream": True}
        ) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[len("data: ") :])["choices"]
        gone = time.monotonic()  # leaving the block closes the connection mid-stream
    assert_cancelled(url, service, trace, gone)


def test_finished_request_is_not_cancelled(server: tuple[str, Service, Path]) -> None:
    url, service, trace = server
    reply = httpx.post(url + "/v1/chat/completions", json={**BODY, "max_tokens": 3}, timeout=30)
    assert reply.status_code == 200
    assert cancelled_total(url) == 0
    (request,) = read_trace(trace)
    assert not request.cancelled  # read back through the trace reader, too
    assert trace_ends(trace) == [False]


def test_streaming_request_abandoned_before_its_first_token_leaves_at_once(
    server: tuple[str, Service, Path],
) -> None:
    """The slow path: a streamed request that waits for its first token (here queued behind
    a full batch) has no response yet, so only the service's poll can see its client go.
    Once seen, it must leave the queue then, not take a row when one frees."""
    url, service, trace = server
    body = {**BODY, "stream": True}
    reading = []  # the holders' line iterators: closing one would close its connection
    with ExitStack() as holders:
        for _ in range(4):  # every row of the batch busy for many seconds
            client = holders.enter_context(httpx.Client(timeout=30))
            reply = holders.enter_context(
                client.stream("POST", url + "/v1/chat/completions", json=body)
            )
            reading.append(reply.iter_lines())
            next(line for line in reading[-1] if line.startswith("data: "))
        assert service.scheduler.running == 4
        with httpx.Client(timeout=1.0) as client, pytest.raises(httpx.ReadTimeout):
            client.post(url + "/v1/chat/completions", json=body)  # queued, then gone
        gone = time.monotonic()
        while service.scheduler.waiting:
            assert time.monotonic() - gone < FREED_WITHIN, "the abandoned request still waits"
            time.sleep(0.02)
        assert service.scheduler.running == 4  # the others go on
    assert_cancelled(url, service, trace, time.monotonic(), count=5)
