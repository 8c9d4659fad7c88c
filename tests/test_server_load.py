"""Load and the real model. Slow: run with ``-m slow``.

Load: 16 concurrent ``openai`` clients on loopback, each sending requests until it has
sent its share or the time is up (bounded in count and time, self-stopping). Zero errors,
every request answered exactly once, greedy answers identical to single-request answers;
p50/p99 latency and throughput are printed, never asserted (timings are not tests).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import ModelDrafter, NgramDrafter
from spectune.drafters.pairing import Loaded
from spectune.models.llama import LlamaLM
from spectune.sampling import SamplingParams
from spectune.server import Limits, create_app
from spectune.server.engines import DraftSource, EngineSettings, build_engine
from spectune.server.service import ServedModel, Service
from spectune.server.testing import running_server, toy_service, toy_tokenizer

pytestmark = pytest.mark.slow

CLIENTS = 16
PER_CLIENT = 8  # requests per client, unless the time runs out first
TIME_LIMIT = 60.0  # seconds for the whole burst
MAX_TOKENS = 24
PROMPTS = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(3 + i % 5)) for i in range(8)]


@dataclass(frozen=True)
class Answer:
    client: int
    index: int
    prompt: int
    text: str
    finishes: int  # finish reasons seen (exactly one for a request answered once)
    seconds: float
    tokens: int


def ask(client: openai.OpenAI, prompt: str, stream: bool) -> tuple[str, int, int]:
    """(text, finish reasons seen, completion tokens) of one greedy request."""
    if not stream:
        result = client.completions.create(
            model="toy", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert result.usage is not None
        finishes = sum(1 for c in result.choices if c.finish_reason)
        return result.choices[0].text, finishes, result.usage.completion_tokens
    text, finishes, tokens = [], 0, 0
    for chunk in client.completions.create(
        model="toy",
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for choice in chunk.choices:
            text.append(choice.text)
            finishes += choice.finish_reason is not None
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return "".join(text), finishes, tokens


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls gain nothing from intra-op threads, and on a shared, oversubscribed
    machine their spinning workers slow every step down tenfold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def loaded_server(
    toy_target: LlamaLM, toy_draft: LlamaLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Service]]:
    tokenizer = toy_tokenizer(tmp_path_factory.mktemp("load-tokenizer"))
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(ModelDrafter(toy_draft)),
        engine=EngineSettings(kind="batch", max_batch=CLIENTS, capacity=512),
        limits=Limits(max_requests=2 * CLIENTS),
    )
    with running_server(create_app(service)) as url:
        yield url, service


def test_sixteen_concurrent_clients(loaded_server: tuple[str, Service]) -> None:
    url, service = loaded_server
    single = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    # Single-request answers first: the reference every concurrent answer must equal.
    reference = [ask(single, prompt, stream=False)[0] for prompt in PROMPTS]

    answers: list[Answer] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + TIME_LIMIT

    def client_loop(client_id: int) -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        for index in range(PER_CLIENT):
            if time.monotonic() > deadline:
                return
            prompt = (client_id + index) % len(PROMPTS)
            start = time.perf_counter()
            try:
                text, finishes, tokens = ask(client, PROMPTS[prompt], stream=index % 2 == 1)
            except Exception as exc:  # every failure is collected and reported below
                with lock:
                    errors.append(f"client {client_id} request {index}: {exc!r}")
                continue
            answer = Answer(
                client_id, index, prompt, text, finishes, time.perf_counter() - start, tokens
            )
            with lock:
                answers.append(answer)

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIME_LIMIT + 120)
    wall = time.perf_counter() - started

    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in threads)
    keys = [(a.client, a.index) for a in answers]
    assert len(keys) == len(set(keys)) >= CLIENTS  # each request answered once
    assert all(a.finishes == 1 for a in answers)
    mismatched = [a for a in answers if a.text != reference[a.prompt]]
    assert not mismatched, f"{len(mismatched)} greedy answers differ from single requests"
    # The scheduler thread notes the last rows freed just after their answers went out.
    deadline_idle = time.monotonic() + 10
    while service.scheduler.running or service.scheduler.waiting:
        assert time.monotonic() < deadline_idle, "rows still held after every answer"
        time.sleep(0.05)

    latencies = sorted(a.seconds for a in answers)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    tokens = sum(a.tokens for a in answers)
    print(
        f"\n{len(answers)} requests from {CLIENTS} clients in {wall:.1f} s: "
        f"p50 {statistics.median(latencies):.3f} s, p99 {p99:.3f} s, "
        f"{len(answers) / wall:.2f} req/s, {tokens / wall:.1f} tokens/s"
    )


def test_real_default_model(smollm2: Loaded) -> None:
    """The default model (SmolLM2-135M-Instruct) behind the server with prompt-lookup
    drafts: greedy chat answers equal the target's own greedy decoding, streamed or not."""
    target, tokenizer = smollm2.model, smollm2.tokenizer
    engine, policies, context = build_engine(
        target,
        DraftSource(NgramDrafter()),
        EngineSettings(kind="batch", max_batch=4, capacity=2048),
        lambda params: FixedK(4),
    )
    service = Service(
        ServedModel("smollm2", target, tokenizer, drafter="ngram"),
        engine,
        context_limit=context,
        policies=policies,
    )
    messages: list[dict[str, str]] = [
        {"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}
    ]
    expected = SpeculativeEngine(target).run(
        tokenizer.encode_chat(messages), SamplingParams(max_tokens=24)
    )
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        result = client.chat.completions.create(
            model="smollm2",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=24,
            temperature=0,
        )
        assert result.choices[0].message.content == tokenizer.decode(expected.tokens)
        assert result.usage is not None
        assert result.usage.completion_tokens == len(expected.tokens)
        extra = result.usage.model_extra or {}
        assert 0 <= extra["accepted"] <= extra["drafted"]
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model="smollm2",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=24,
                temperature=0,
                stream=True,
            )
            if chunk.choices
        )
        assert streamed == result.choices[0].message.content
