"""``spectune serve`` wiring, in-process: the models are toys, the address it would listen
on and the app it would serve are captured, then that app answers a real client on a
loopback port."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import openai
import pytest

from spectune.cli import main
from spectune.drafters import pairing
from spectune.drafters.pairing import Loaded
from spectune.models.llama import LlamaLM
from spectune.server import run as server_run  # serve imports listen/serve_on from it
from spectune.server.testing import running_server, toy_tokenizer


@pytest.fixture()
def captured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, toy_target: LlamaLM
) -> dict[str, Any]:

    tokenizer = toy_tokenizer(tmp_path / "tok")
    weights = tmp_path / "toy.gguf"
    weights.touch()  # never read: load_target is replaced below
    loaded = Loaded(toy_target, tokenizer, weights)
    calls: dict[str, Any] = {}
    real_listen = server_run.listen

    def listen(host: str, port: int) -> socket.socket:
        calls.update(host=host, port=port)
        return real_listen("127.0.0.1", 0)  # checked as given, bound where tests may

    # the command line looks the loader up when it runs
    monkeypatch.setattr(pairing, "load_target", lambda ref, **kw: loaded)
    monkeypatch.setattr(server_run, "listen", listen)
    monkeypatch.setattr(server_run, "serve_on", lambda app, sock, **kw: calls.update(app=app))
    monkeypatch.delenv("SPECTUNE_API_KEY", raising=False)
    return calls


def test_serve_defaults_to_loopback(captured: dict[str, Any]) -> None:
    assert main(["serve", "--engine", "sequential"]) == 0
    assert (captured["host"], captured["port"]) == ("127.0.0.1", 8000)
    with running_server(captured["app"]) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["toy"]
        result = client.completions.create(
            model="default", prompt="w1 w2 w1 w2", max_tokens=6, temperature=0
        )
        assert result.usage is not None and result.usage.completion_tokens == 6


def test_serve_warns_without_a_key_off_loopback(
    captured: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--engine", "sequential", "--host", "0.0.0.0", "--port", "9"]) == 0
    assert "without an API key" in capsys.readouterr().err
    assert main(["serve", "--engine", "sequential", "--host", "0.0.0.0", "--api-key", "k"]) == 0
    assert "without an API key" not in capsys.readouterr().err


def test_serve_rejects_bad_settings(captured: dict[str, Any]) -> None:
    assert main(["serve", "--max-tokens", "0"]) == 2
    assert main(["serve", "--threads", "0"]) == 2
    assert main(["serve", "--max-batch", "0"]) == 2
    assert main(["serve", "--speculate-max-batch", "-1"]) == 2
    assert main(["serve", "--policy", "fixed", "-k", "99"]) == 2
    assert "app" not in captured


def _service_of(captured: dict[str, Any]) -> Any:
    return captured["app"].state.service


def test_serve_keeps_each_tenants_history_apart_by_default(
    captured: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a alice\nkey-b bob\n", encoding="utf-8")
    assert main(["serve", "--draft", "suffix:none", "--api-keys", str(keys)]) == 0
    err = capsys.readouterr().err
    assert "suffix history tenant, 262144 tokens" in err and "warning" not in err
    service = _service_of(captured)
    assert service.drafters.scope == "tenant"
    assert dict(service.keys.tenants) == {"key-a": "alice", "key-b": "bob"}
    with running_server(captured["app"]) as url:
        bad = openai.OpenAI(base_url=url + "/v1", api_key="key-c", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="key-b", max_retries=0)
        assert [m.id for m in good.models.list()] == ["toy"]

    assert main(["serve", "--draft", "suffix:none"]) == 0  # no keys: no history at all
    assert "suffix history none" in capsys.readouterr().err
    assert _service_of(captured).drafters is None


def test_serve_warns_of_a_global_history(
    captured: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["serve", "--draft", "suffix:none", "--suffix-history-scope", "global", "--api-key", "k"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "warning: --suffix-history-scope global" in err and "suffix history global" in err
    assert _service_of(captured).drafters.scope == "global"


def test_serve_refuses_bad_tenant_settings(
    captured: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["serve", "--draft", "suffix:none", "--suffix-history-scope", "tenant"]) == 2
    assert "needs API keys" in capsys.readouterr().err
    assert main(["serve", "--api-keys", str(tmp_path / "absent")]) == 2
    assert "cannot read API keys" in capsys.readouterr().err
    assert main(["serve", "--suffix-history-tokens", "-1"]) == 2
    assert "app" not in captured
