"""Bad input on the command line: one clear line on stderr, exit status 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectune.cli import main
from spectune.models.loading import save_native
from spectune.models.toy import toy_model


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(args)
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--k", "0"], "K (draft tokens per step) must be in [1, 32]"),
        (["--k", "500"], "K (draft tokens per step) must be in [1, 32]"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--max-tokens", "0"], "max_tokens must be >= 1"),
        (["--target", "/nonexistent/model.gguf"], "model not found: /nonexistent/model.gguf"),
    ],
)
def test_parameter_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = run_cli(["generate", "hello", *args], capsys)
    assert status == 2
    assert message in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_corrupt_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00garbage" * 10)
    status, err = run_cli(["generate", "hello", "--target", str(bad)], capsys)
    assert status == 2
    assert "cannot read GGUF file" in err


def test_folder_without_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "model"
    save_native(toy_model(0), folder)
    (folder / "model.safetensors").unlink()
    status, err = run_cli(["generate", "hello", "--target", str(folder)], capsys)
    assert status == 2
    assert "no .safetensors weights" in err


def test_truncated_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "model"
    save_native(toy_model(0), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    status, err = run_cli(["generate", "hello", "--target", str(folder)], capsys)
    assert status == 2
    assert "cannot read" in err


@pytest.mark.slow
def test_incompatible_draft_vocabulary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-draft"
    save_native(toy_model(0), folder)  # vocabulary 64 against the target's 49152
    status, err = run_cli(["generate", "hello", "--draft", str(folder)], capsys)
    assert status == 2
    assert "vocabulary sizes differ by 49088" in err


@pytest.mark.slow
def test_empty_and_overlong_prompts(capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_cli(["generate", ""], capsys)
    assert status == 2
    assert "the prompt is empty" in err
    status, err = run_cli(["generate", "word " * 9000, "--max-tokens", "4"], capsys)
    assert status == 2
    assert "the context holds 8192" in err


@pytest.mark.slow
def test_generate_json_compare(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    status = main(["generate", "--chat", "Say hello.", "--max-tokens", "12", "--json", "--compare"])
    out = capsys.readouterr().out
    assert status == 0
    report = json.loads(out)
    assert report["identical_to_plain"] is True
    assert report["speculative"]["tokens"] == report["plain"]["tokens"]
    assert report["text"]
