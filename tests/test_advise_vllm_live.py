"""``advise --engine vllm`` on a real vLLM (the CPU build, ``make vllm``): the quick run on
the default target with n-gram drafting ends with a verdict measured on vLLM, and
advice.json holds both engines' figures. spectune's quick screening, then two vLLM
servers (eager), three prompts of 24 tokens each: a few minutes on two cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _vllm import LIVE
from spectune.advise.vllm_check import DO_NOT_SPECULATE_ON_VLLM
from spectune.cli import main

pytestmark = LIVE


def test_quick_advise_ends_with_a_verdict_measured_on_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "advice"
    args = ["advise", "--target", "default", "--draft", "ngram", "--quick", "--engine", "vllm"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "advice.json").read_text())

    summary = data["verdict"]["summary"]
    on_vllm = summary.startswith("speculate with ngram K=") and summary.endswith(
        "x measured on vLLM"
    )
    assert on_vllm or summary == DO_NOT_SPECULATE_ON_VLLM
    assert f"Verdict: {summary}" in printed
    assert data["settings"]["measured_on"]["verdict_on"] == "vllm"
    assert "the verdict is vLLM's own" in data["notes"][0]
    assert data["screening_verdict"]["summary"]  # spectune's own, kept beside it

    check = data["engine_check"]
    assert check["measured"] is True and check["reason"] is None
    assert check["speculative_config"]["method"] == "ngram"
    spectune, vllm = check["spectune"], check["vllm"]
    assert spectune["measured_speedup"] > 0 and spectune["plain_tokens_per_second"] > 0
    assert vllm["plain"]["requests"] == vllm["speculative"]["requests"] == 3  # --quick
    assert vllm["rounds"] == 1 and len(vllm["per_prompt_speedup"]) == 3
    assert vllm["plain"]["tokens"] > 0 and vllm["speculative"]["tokens"] > 0
    assert vllm["speedup"] > 0 and vllm["acceptance"] is not None
    assert vllm["acceptance"]["accepted"] <= vllm["acceptance"]["draft_tokens"]
    assert vllm["same_output"] == 3  # greedy: speculation changes the speed, not the text
    if summary == DO_NOT_SPECULATE_ON_VLLM:
        assert data["verdict"]["reasons"][-1].startswith("next step: serve without speculation")
    else:
        command = (out / "export-vllm.txt").read_text().strip()
        assert command == check["command"] and "--speculative-config" in command
