"""Serving several tenants: API keys and their tenants, per-tenant suffix histories under one
bound, and the leak they close (a client must not draft from another client's outputs)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from spectune.drafters.suffix import SuffixDrafter
from spectune.drafters.suffix_history import TenantHistories
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.tokenizer import Tokenizer
from spectune.server import Limits, create_app
from spectune.server.engines import DraftSource, EngineSettings, RequestDrafters
from spectune.server.errors import APIError
from spectune.server.limits import ApiKeys
from spectune.server.service import Service
from spectune.server.testing import running_server, toy_service, toy_tokenizer

LIMITS = Limits(max_body_bytes=4096, max_prompt_tokens=64, max_tokens=64, default_max_tokens=16)
KEYS = ApiKeys({"key-a": "alice", "key-b": "bob"})
PROMPT = "w3 w9 w4 w17 w2 w30"


# -- the stores ------------------------------------------------------------------------


def test_each_tenant_drafts_from_its_own_store() -> None:
    histories = TenantHistories(max_tokens=100)
    histories.store("alice").add(0, [5, 6, 7, 8])
    assert histories.store("bob").find([5], 4) is None
    match = histories.store("alice").find([5], 4)
    assert match is not None and match.length == 1
    assert histories.tenants() == ["bob", "alice"]  # least recently served first


def test_the_stores_share_one_bound_and_the_oldest_tenant_goes() -> None:
    histories = TenantHistories(max_tokens=10)
    histories.store("a").add(0, [1, 2, 3, 4])
    histories.store("b").add(1, [5, 6, 7, 8])
    histories.store("c").add(2, [9, 10, 11])  # 11 tokens in all: tenant a goes whole
    assert histories.tenants() == ["b", "c"] and histories.num_tokens == 7
    assert histories.evicted == 1
    histories.store("b").add(3, [12, 13, 14, 15])  # b served again, 11 in all: c goes
    assert histories.tenants() == ["b"] and histories.num_tokens == 8
    histories.store("b").add(4, list(range(20, 28)))  # alone past the bound: its own oldest go
    assert histories.tenants() == ["b"] and histories.num_tokens == 8


def test_filing_counts_as_being_served() -> None:
    histories = TenantHistories(max_tokens=10)
    old = histories.store("a")  # a request of tenant a starts ...
    histories.store("b").add(0, [1, 2, 3])
    old.add(1, [4, 5, 6])  # ... and files its output last: b is now the oldest
    histories.store("c").add(2, [7, 8, 9, 10, 11])
    assert histories.tenants() == ["a", "c"]


def test_a_dropped_tenants_store_is_emptied() -> None:
    histories = TenantHistories(max_tokens=4)
    store = histories.store("a")
    store.add(0, [1, 2, 3])
    histories.store("b").add(1, [4, 5])
    assert store.num_tokens == 0 and len(store) == 0 and store.find([1], 4) is None


# -- the keys --------------------------------------------------------------------------


def test_keys_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# key tenant\nk1 alice\n\nk2\tbob smith\nk3 alice\n", encoding="utf-8")
    keys = ApiKeys.read(path, extra={"single": "default"})
    assert dict(keys.tenants) == {
        "single": "default",
        "k1": "alice",
        "k2": "bob smith",
        "k3": "alice",
    }
    assert keys.tenant_of("Bearer k2") == "bob smith"
    assert keys.tenant_of("bearer  k3 ") == "alice"
    for bad in (None, "", "Bearer", "Bearer k4", "Basic k1", "k1", "Bearer k1x"):
        with pytest.raises(APIError) as caught:
            keys.tenant_of(bad)
        assert caught.value.status == 401


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k1 alice\nk2\n", "line 2: expected 'KEY TENANT', got one word"),
        ("k1 alice\nk1 bob\n", "line 2: this key is given twice"),
        ("# nothing\n\n", "holds no API keys"),
        (b"\xff\xfe".decode("latin-1"), "expected 'KEY TENANT'"),
    ],
)
def test_bad_keys_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "keys"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidParameterError, match=message):
        ApiKeys.read(path)


def test_a_missing_keys_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="cannot read API keys from"):
        ApiKeys.read(tmp_path / "absent")


# -- the server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return toy_tokenizer(tmp_path_factory.mktemp("toy-tokenizer"))


@pytest.fixture
def sources(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where every suffix draft came from ("context", "history", ...), in order."""
    seen: list[str] = []
    propose = SuffixDrafter.propose

    def spy(self: SuffixDrafter, *args: Any) -> Any:
        draft = propose(self, *args)
        seen.append(self.last.source)
        return draft

    monkeypatch.setattr(SuffixDrafter, "propose", spy)
    return seen


@pytest.fixture
def served(
    request: pytest.FixtureRequest, toy_target: LlamaLM, tokenizer: Tokenizer
) -> Iterator[tuple[str, Service]]:
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(SuffixDrafter()),  # no corpus: drafts from context and history
        engine=EngineSettings(capacity=256),
        limits=LIMITS,
        keys=KEYS,
        history_scope=request.param,
        spec_usage=True,
    )
    with running_server(create_app(service)) as url:
        yield url, service


def _complete(url: str, key: str) -> dict[str, Any]:
    body = {"model": "toy", "prompt": PROMPT, "max_tokens": 40, "temperature": 0}
    reply = httpx.post(
        f"{url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def _filed(drafters: RequestDrafters | None, tokens: int) -> None:
    """Wait until the history holds ``tokens`` (a request's drafter files its output when
    the engine drops it, just after the response)."""
    assert drafters is not None
    deadline = time.monotonic() + 10
    while drafters.num_tokens < tokens:
        assert time.monotonic() < deadline, "the output was never filed"
        time.sleep(0.01)


def _counts(reply: dict[str, Any]) -> tuple[int, int, int]:
    usage = reply["usage"]
    return usage["drafted"], usage["accepted"], usage["steps"]


@pytest.mark.parametrize("served", ["tenant"], indirect=True)
def test_one_tenants_output_never_drafts_for_another(
    served: tuple[str, Service], sources: list[str]
) -> None:
    """Bob sends the prompt Alice sent: were Alice's output a draft source for Bob, his
    acceptance (and latency) would tell him what she was answered."""
    url, service = served
    first = _complete(url, "key-a")
    _filed(service.drafters, 1)
    assert "history" not in sources
    text = first["choices"][0]["text"]

    del sources[:]
    bob = _complete(url, "key-b")
    assert bob["choices"][0]["text"] == text  # greedy: the same answer ...
    assert _counts(bob) == _counts(first)  # ... drafted exactly as with no history at all
    assert "history" not in sources

    del sources[:]
    again = _complete(url, "key-a")  # Alice's own history does serve her
    assert "history" in sources
    assert again["usage"]["accepted"] > first["usage"]["accepted"]
    assert service.drafters is not None and service.drafters.tenants is not None
    assert service.drafters.tenants.tenants() == ["bob", "alice"]


@pytest.mark.parametrize("served", ["global"], indirect=True)
def test_a_global_history_leaks_between_tenants(
    served: tuple[str, Service], sources: list[str]
) -> None:
    url, service = served
    first = _complete(url, "key-a")
    _filed(service.drafters, 1)
    del sources[:]
    bob = _complete(url, "key-b")
    assert "history" in sources
    assert bob["usage"]["accepted"] > first["usage"]["accepted"]  # what the default prevents


def test_responses_without_speculation_counts(toy_target: LlamaLM, tokenizer: Tokenizer) -> None:
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(SuffixDrafter()),
        engine=EngineSettings(capacity=256),
        limits=LIMITS,
        keys=KEYS,
        spec_usage=False,
    )
    with running_server(create_app(service)) as url:
        usage = _complete(url, "key-b")["usage"]
        assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
        metrics = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer key-a"}).text
        assert "spectune_spec_decode_num_steps_total" in metrics
        assert httpx.get(f"{url}/metrics").status_code == 401
