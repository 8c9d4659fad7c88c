"""Bad input on the command line that needs the real default model: one clear line on
stderr, exit status 2, no traceback. The table of every other bad input, for every
command and endpoint, is ``test_bad_input.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectune.cli import main
from spectune.drafters.pairing import Loaded
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.models.toy import toy_model


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(args)
    err = capsys.readouterr().err
    return status, err


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


@pytest.mark.slow
def test_default_drafter_is_the_suffix_drafter_where_its_index_serves(
    smollm2: Loaded, toy_target: LlamaLM, tmp_path: Path
) -> None:
    from spectune.cli.common import default_drafter
    from spectune.server.testing import toy_tokenizer

    assert default_drafter(smollm2) == "suffix"  # the shipped index has its vocabulary
    toy = Loaded(toy_target, toy_tokenizer(tmp_path / "tok"), tmp_path / "toy.gguf")
    assert default_drafter(toy) == "ngram"
