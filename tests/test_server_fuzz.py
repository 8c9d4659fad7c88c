"""Fuzzing: schemathesis generates requests from the server's own OpenAPI schema, valid
and invalid; no answer may be a 5xx, and the server keeps serving. Bounded: a fixed number
of derandomized examples per operation and mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from spectune.drafters import ModelDrafter
from spectune.models.llama import LlamaLM
from spectune.server import Limits, create_app
from spectune.server.engines import DraftSource, EngineSettings
from spectune.server.testing import running_server, toy_service, toy_tokenizer

EXAMPLES = 25  # per operation and mode


@pytest.fixture(scope="module")
def base_url(
    toy_target: LlamaLM, toy_draft: LlamaLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    tokenizer = toy_tokenizer(Path(tmp_path_factory.mktemp("fuzz-tokenizer")))
    limits = Limits(
        max_body_bytes=8192,
        max_prompt_tokens=64,
        max_tokens=8,
        default_max_tokens=4,
        max_requests=8,
    )
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(ModelDrafter(toy_draft)),
        engine=EngineSettings(kind="batch", capacity=512),
        limits=limits,
    )
    with running_server(create_app(service)) as url:
        yield url


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(base_url: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    failures: list[str] = []
    statuses: dict[tuple[str, int], int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions"}
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # nothing to make invalid in a request without a body or parameters
        strategy = operation.as_strategy(generation_mode=mode)

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case) -> None:
            if mode == GenerationMode.POSITIVE and isinstance(case.body, dict):
                # Reach generation, not only the 404 and the max_tokens limit.
                case.body["model"] = "toy"
                for key in ("max_tokens", "max_completion_tokens"):
                    if isinstance(case.body.get(key), int):
                        case.body[key] = min(case.body[key], 8)
            response = case.call(base_url=base_url, timeout=30)
            key = (case.method, response.status_code)
            statuses[key] = statuses.get(key, 0) + 1
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.path} {case.body!r} -> "
                    f"{response.status_code} {response.text[:200]}"
                )

        check()
    print(f"{mode.value}: status counts {dict(sorted(statuses.items()))}")
    assert not failures, "\n".join(failures[:5])
    if mode == GenerationMode.POSITIVE:
        assert statuses.get(("POST", 200), 0) >= EXAMPLES // 3  # generation itself was fuzzed
    assert httpx.get(base_url + "/health").json()["status"] == "ok"
