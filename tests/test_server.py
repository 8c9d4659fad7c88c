"""The HTTP server, tested with the official ``openai`` client against a real uvicorn server
on a loopback port, over toy models (a word-level tokenizer with a chat template and
``toy_model``'s matching vocabulary). One slow test serves the real default model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
import torch

from spectune.decode.engine import SpeculativeEngine
from spectune.decode.sequential import SequenceUpdate, SequentialBatchEngine
from spectune.drafters import ModelDrafter
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.scripted import FailingDrafter, ScriptedDrafter
from spectune.models.llama import LlamaLM
from spectune.models.tokenizer import Tokenizer
from spectune.sampling import SamplingParams
from spectune.server import Limits, create_app
from spectune.server.engines import DraftSource, EngineSettings
from spectune.server.service import ServedModel, Service
from spectune.server.testing import running_server, toy_service, toy_tokenizer

ENGINE = "batch"  # the sequential engine, the reference, has its own test below
LIMITS = Limits(max_body_bytes=4096, max_prompt_tokens=64, max_tokens=300, default_max_tokens=16)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return toy_tokenizer(tmp_path_factory.mktemp("toy-tokenizer"))


@pytest.fixture(scope="module")
def server(
    toy_target: LlamaLM, toy_draft: LlamaLM, tokenizer: Tokenizer
) -> Iterator[tuple[str, Service]]:
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(ModelDrafter(toy_draft)),
        engine=engine(),
        limits=LIMITS,
    )
    with running_server(create_app(service)) as url:
        yield url, service


@pytest.fixture(scope="module")
def client(server: tuple[str, Service]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def engine(**settings: int) -> EngineSettings:
    return EngineSettings(kind=ENGINE, capacity=512, **settings)  # type: ignore[arg-type]


def plain_greedy(target: LlamaLM, tokenizer: Tokenizer, prompt: list[int], max_tokens: int) -> str:
    """The reference: the target alone, greedy, one request."""
    gen = SpeculativeEngine(target).run(prompt, SamplingParams(max_tokens=max_tokens))
    return tokenizer.decode(gen.tokens)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- the OpenAI surface --------------------------------------------------------------------


def test_models_and_health(client: openai.OpenAI, server: tuple[str, Service]) -> None:
    assert [m.id for m in client.models.list()] == ["toy"]
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok"


def test_completion_is_greedy_exact_with_usage(
    client: openai.OpenAI, toy_target: LlamaLM, tokenizer: Tokenizer
) -> None:
    result = client.completions.create(model="toy", prompt="w1 w2 w3", max_tokens=20, temperature=0)
    choice = result.choices[0]
    assert choice.text == plain_greedy(toy_target, tokenizer, tokenizer.encode("w1 w2 w3"), 20)
    usage = result.usage
    assert usage is not None
    assert usage.prompt_tokens == 3
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    extra = usage.model_extra or {}
    assert extra["drafted"] > 0 and 0 <= extra["accepted"] <= extra["drafted"]
    assert extra["acceptance_rate"] == pytest.approx(extra["accepted"] / extra["drafted"], abs=1e-4)
    assert extra["mean_accepted_length"] >= 1.0
    assert extra["fallbacks"] == 0
    assert choice.finish_reason in ("length", "stop")


def test_chat_through_template_and_stream_match(
    client: openai.OpenAI, toy_target: LlamaLM, tokenizer: Tokenizer
) -> None:
    messages = [{"role": "system", "content": "w9"}, {"role": "user", "content": "w5 w6"}]
    result = client.chat.completions.create(
        model="toy",
        messages=messages,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    text = result.choices[0].message.content
    assert text == plain_greedy(toy_target, tokenizer, tokenizer.encode_chat(messages), 16)
    assert result.usage is not None and result.usage.prompt_tokens == len(
        tokenizer.encode_chat(messages)
    )
    chunks = list(
        client.chat.completions.create(
            model="toy",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == result.usage.completion_tokens


def test_stop_string_never_streamed(client: openai.OpenAI) -> None:
    full = client.completions.create(model="toy", prompt="w1 w2", max_tokens=20, temperature=0)
    words = full.choices[0].text.split()
    stop = " ".join(words[3:5])  # two words: the stop string spans steps
    pieces = list(
        client.completions.create(
            model="toy", prompt="w1 w2", max_tokens=20, temperature=0, stop=[stop], stream=True
        )
    )
    text = "".join(p.choices[0].text for p in pieces)
    assert text == full.choices[0].text[: full.choices[0].text.index(stop)]
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def sample() -> str:
        return (
            client.completions.create(
                model="toy", prompt="w3", max_tokens=12, temperature=0.9, top_p=0.9, seed=7
            )
            .choices[0]
            .text
        )

    assert sample() == sample()


def test_spectune_extension(client: openai.OpenAI) -> None:
    def usage(options: dict[str, object]) -> dict[str, object]:
        result = client.completions.create(
            model="toy", prompt="w4", max_tokens=10, temperature=0, extra_body={"spectune": options}
        )
        assert result.usage is not None
        return result.usage.model_extra or {}

    assert usage({"off": True})["drafted"] == 0
    two = usage({"k": 2})
    assert 0 < int(two["drafted"]) <= 2 * int(two["steps"])  # type: ignore[call-overload]
    with pytest.raises(openai.BadRequestError, match="not served"):
        usage({"drafter": "other"})


def test_metrics_endpoint(client: openai.OpenAI, server: tuple[str, Service]) -> None:
    client.completions.create(model="toy", prompt="w1", max_tokens=4, temperature=0)
    list(client.completions.create(model="toy", prompt="w1", max_tokens=4, stream=True))
    assert server[1].metrics.cancelled._value.get() == 0  # type: ignore[attr-defined]
    text = httpx.get(server[0] + "/metrics").text
    for name in (
        "spectune_spec_decode_num_draft_tokens_total",
        "spectune_spec_decode_num_accepted_tokens_total",
        "spectune_requests_total",
        "spectune_batch_size_bucket",
    ):
        assert name in text


# -- refusals: each a 4xx in OpenAI's shape, and the server keeps serving ---------------


def error_of(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, object] = body["error"]
    return error


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "toy", "prompt": "w1", "max_tokens": "5"}, 400, "max_tokens"),
        ({"model": "toy", "prompt": 5}, 400, "prompt"),
        ({"model": "toy"}, 400, "prompt"),
        ({"model": "toy", "prompt": "w1", "n": 2}, 400, "n"),
        ({"model": "toy", "prompt": "w1", "temperature": -1}, 400, "temperature"),
        ({"model": "toy", "prompt": "w1", "max_tokens": 301}, 400, "max_tokens"),
        ({"model": "toy", "prompt": " ".join(["w1"] * 65)}, 400, "prompt"),
        ({"model": "toy", "prompt": [1, 2, 999]}, 400, "prompt"),
        ({"model": "gpt-4", "prompt": "w1"}, 404, "model"),
        ({"model": "toy", "prompt": "w1", "stop": [""]}, 400, "stop"),
    ],
)
def test_bad_requests_are_4xx(
    server: tuple[str, Service], body: dict[str, object], status: int, param: str
) -> None:
    response = httpx.post(server[0] + "/v1/completions", json=body)
    assert response.status_code == status, response.text
    assert error_of(response)["param"] == param


def test_malformed_json_and_oversize_body(server: tuple[str, Service]) -> None:
    url = server[0] + "/v1/chat/completions"
    headers = {"Content-Type": "application/json"}
    response = httpx.post(url, content=b'{"model": "toy", "messages": [', headers=headers)
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"
    big = json.dumps({"model": "toy", "messages": [{"role": "user", "content": "w1 " * 3000}]})
    response = httpx.post(url, content=big.encode(), headers=headers)
    assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield big.encode()

    response = httpx.post(url, content=chunked(), headers=headers)
    assert response.status_code == 413
    ok = httpx.post(url, json={"model": "toy", "messages": [{"role": "user", "content": "w1"}]})
    assert ok.status_code == 200


def test_api_key(toy_target: LlamaLM, tokenizer: Tokenizer) -> None:
    service = toy_service(toy_target, tokenizer, api_key="s3cret", engine=engine(), limits=LIMITS)
    with running_server(create_app(service)) as url:
        for key in ("wrong", "s3cret-but-longer"):
            bad = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        response = httpx.get(url + "/metrics")
        assert response.status_code == 401 and error_of(response)["code"] == "invalid_api_key"
        assert httpx.get(url + "/health").status_code == 200  # probes need no key
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model="toy", prompt="w1", max_tokens=3).choices


# -- faults ------------------------------------------------------------------------------


def slow_drafter(vocab_size: int) -> DraftSource:
    """Drafts one fixed token, slowly: requests last long enough to be interrupted."""
    return DraftSource(
        drafters=lambda: ScriptedDrafter(
            lambda context, k: [7] * k, vocab_size=vocab_size, delay=0.02
        ),
        label="slow",
    )


def test_disconnect_mid_stream_frees_the_row(toy_target: LlamaLM, tokenizer: Tokenizer) -> None:
    service = toy_service(
        toy_target, tokenizer, draft=slow_drafter(64), engine=engine(), limits=LIMITS
    )
    body = {"model": "toy", "prompt": "w8", "max_tokens": 300, "temperature": 0, "stream": True}
    with running_server(create_app(service)) as url:
        bystander: dict[str, str] = {}

        def other() -> None:  # a request that runs alongside and must be undisturbed
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            result = client.completions.create(
                model="toy", prompt="w8", max_tokens=12, temperature=0
            )
            bystander["text"] = result.choices[0].text

        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            thread = threading.Thread(target=other)
            thread.start()
        # The client is gone: the request leaves the batch long before 300 tokens.
        assert wait_until(lambda: service.scheduler.running == 0 and not thread.is_alive())
        thread.join()
        assert bystander["text"] == plain_greedy(toy_target, tokenizer, tokenizer.encode("w8"), 12)
        assert service.metrics.cancelled._value.get() == 1  # type: ignore[attr-defined]
        assert httpx.get(url + "/health").json()["running"] == 0


def test_too_many_requests_is_429(toy_target: LlamaLM, tokenizer: Tokenizer) -> None:
    limits = Limits(max_tokens=300, max_requests=1)
    service = toy_service(
        toy_target, tokenizer, draft=slow_drafter(64), engine=engine(), limits=limits
    )
    # Greedy, so the first request's length does not depend on a random draw: sampled, it
    # could end at an early EOS before the second request arrives (seen once in the suite);
    # greedy, "w8" runs 109 tokens on the toy target, ~2 s with the slow drafter.
    body = {"model": "toy", "prompt": "w8", "max_tokens": 300, "temperature": 0, "stream": True}
    with running_server(create_app(service)) as url:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as first:
            assert first.status_code == 200
            second = httpx.post(url + "/v1/completions", json={**body, "stream": False})
            assert second.status_code == 429
            assert error_of(second)["type"] == "rate_limit_error"
        assert wait_until(lambda: service.scheduler.running == 0)
        again = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 3, "stream": False})
        assert again.status_code == 200


@pytest.mark.parametrize("mode", ["raise", "nan"])
def test_failing_drafter_falls_back(toy_target: LlamaLM, tokenizer: Tokenizer, mode: str) -> None:
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(drafters=lambda: FailingDrafter(mode, vocab_size=64, after=1)),
        engine=engine(),
        limits=LIMITS,
    )
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        result = client.completions.create(
            model="toy", prompt="w2 w3", max_tokens=16, temperature=0
        )
        assert result.choices[0].text == plain_greedy(
            toy_target, tokenizer, tokenizer.encode("w2 w3"), 16
        )
        extra = (result.usage.model_extra or {}) if result.usage else {}
        assert extra["fallbacks"] > 0
        assert any("drafter_error" in r for r in extra["fallback_reasons"])
        metrics = httpx.get(url + "/metrics").text
        line = 'spectune_spec_decode_fallback_steps_total{kind="drafter_error"} '
        counted = [float(x[len(line) :]) for x in metrics.splitlines() if x.startswith(line)]
        assert counted == [extra["fallbacks"]]


def test_speculation_off_above_batch_limit(toy_target: LlamaLM, tokenizer: Tokenizer) -> None:
    service = toy_service(
        toy_target,
        tokenizer,
        draft=slow_drafter(64),
        engine=engine(speculate_max_batch=0),  # any batch is too large: never speculate
        limits=LIMITS,
    )
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        result = client.completions.create(model="toy", prompt="w2", max_tokens=5, temperature=0)
        extra = (result.usage.model_extra or {}) if result.usage else {}
        assert extra["drafted"] == 0 and extra["fallback_reasons"] == ["batch_too_large: 1 > 0"]


def test_extreme_but_valid_sampling_values(client: openai.OpenAI) -> None:
    """Found by the fuzzer: a temperature or top_p that underflows must still decode."""
    for options in ({"temperature": 1e-300}, {"temperature": 1.0, "top_p": 5e-324}):
        result = client.completions.create(model="toy", prompt="w1", max_tokens=4, **options)
        assert result.choices[0].finish_reason in ("length", "stop")


def test_policy_by_name(client: openai.OpenAI) -> None:
    for policy in ("threshold", "cost", "fixed"):
        result = client.completions.create(
            model="toy",
            prompt="w4",
            max_tokens=8,
            temperature=0,
            extra_body={"spectune": {"policy": policy, "k": 3}},
        )
        assert result.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(
            model="toy", prompt="w4", max_tokens=8, extra_body={"spectune": {"policy": "magic"}}
        )


class StepFailsOnce(SequentialBatchEngine):
    """An engine whose first step fails outright (not per request): the batch is lost."""

    def __init__(self, target: LlamaLM) -> None:
        super().__init__(target)
        self.failed = False

    def step(self) -> list[SequenceUpdate]:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the accelerator fell over")
        return super().step()


def test_engine_failure_fails_the_batch_not_the_server(
    toy_target: LlamaLM, tokenizer: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = StepFailsOnce(toy_target)
    service = Service(ServedModel("toy", toy_target, tokenizer), engine, limits=LIMITS)
    with running_server(create_app(service)) as url:
        body = {"model": "toy", "prompt": "w1", "max_tokens": 4, "temperature": 0}
        failed = httpx.post(url + "/v1/completions", json=body)
        assert failed.status_code == 500 and error_of(failed)["type"] == "server_error"
        assert engine.active == 0  # its row was freed
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200
        assert httpx.get(url + "/health").json()["status"] == "ok"
    messages = [r.getMessage() for r in caplog.records]
    assert any("batch step failed" in m for m in messages)
    assert not any("iteration failed" in m for m in messages)  # handled where it belongs


def test_sequential_engine_is_exact(
    toy_target: LlamaLM, toy_draft: LlamaLM, tokenizer: Tokenizer
) -> None:
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(ModelDrafter(toy_draft)),
        engine=EngineSettings(kind="sequential", capacity=512),
        limits=LIMITS,
    )
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        result = client.completions.create(
            model="toy", prompt="w3 w1", max_tokens=16, temperature=0
        )
        expected = plain_greedy(toy_target, tokenizer, tokenizer.encode("w3 w1"), 16)
        assert result.choices[0].text == expected


@pytest.mark.parametrize("kind", ["batch", "sequential"])
def test_feature_head_draft_is_served_exactly(
    toy_target: LlamaLM, toy_feature_drafter: FeatureDrafter, tokenizer: Tokenizer, kind: str
) -> None:
    """``serve --draft <feature head>`` drafts with the head (batched), not a fallback."""
    draft = DraftSource(toy_feature_drafter)
    assert draft.for_batch() is toy_feature_drafter and draft.name == toy_feature_drafter.name
    service = toy_service(
        toy_target,
        tokenizer,
        draft=draft,
        engine=EngineSettings(kind=kind, capacity=512),  # type: ignore[arg-type]
        limits=LIMITS,
    )
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for prompt in ("w3 w1", "w5 w9 w2 w7"):
            result = client.completions.create(
                model="toy", prompt=prompt, max_tokens=16, temperature=0
            )
            expected = plain_greedy(toy_target, tokenizer, tokenizer.encode(prompt), 16)
            assert result.choices[0].text == expected


def test_draft_source_keeps_what_each_drafter_needs(toy_draft: LlamaLM) -> None:
    """Learned drafters batch as themselves (they are sources, written for rows, a reduced
    vocabulary's id map included); simple ones as per-row fresh copies; every request of
    the sequential engine gets a fresh copy."""
    from spectune.drafters import ModelDrafter, NgramDrafter
    from spectune.drafters.batched import PerRow

    assert DraftSource(None).name is None and DraftSource(None).for_batch() is None
    ngram = DraftSource(NgramDrafter())
    per_row = ngram.for_batch()
    assert ngram.name == "ngram" and isinstance(per_row, PerRow)
    assert isinstance(per_row.factory(), NgramDrafter)
    model = ModelDrafter(toy_draft)
    assert DraftSource(model).for_batch() is model and DraftSource(model).name == model.name
    reduced = ModelDrafter(toy_draft, vocab_subset=torch.arange(32), name="reduced")
    source = DraftSource(reduced)
    assert source.name == "reduced" and source.for_batch() is reduced
    factory = source.factory()
    assert factory is not None
    made = factory()
    assert isinstance(made, ModelDrafter) and made is not reduced
    assert made.vocab_subset is not None and made.name == "reduced"  # id map and name kept
    custom = DraftSource(drafters=lambda: NgramDrafter())
    assert custom.name == "custom" and isinstance(custom.for_batch(), PerRow)
