"""A real vLLM (the CPU build, ``make vllm``) serving the converted default target: greedy
output with suffix speculation equals output without it, and ``spectune watch``'s totals
equal vLLM's own counters and the sums of its per-request speculation metrics
(``--per-request-spec-decode-metrics``). Two server starts, eager, short answers: a few
minutes on two cores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _vllm import LIVE, chat
from spectune.cli import main
from spectune.engines.hf_folder import check_logits, convert_target
from spectune.engines.metrics import read_exposition
from spectune.engines.vllm import VllmSettings, vllm_server

pytestmark = LIVE

PROMPTS = (
    "Count from 1 to 30, separated by commas.",
    "Write a Python function that returns the square of a number.",
    "Name the days of the week, one per line.",
)
MAX_TOKENS = 40
SUFFIX = {"method": "suffix", "num_speculative_tokens": 3}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vllm") / "target"
    convert_target("default", folder)
    assert check_logits("default", folder).passed
    return folder


@pytest.fixture(scope="module")
def plain_answers(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    log = tmp_path_factory.mktemp("logs") / "vllm-plain.log"
    with vllm_server(VllmSettings(target), log=log) as url:
        answers = [
            chat(url, target, p, MAX_TOKENS)["choices"][0]["message"]["content"] for p in PROMPTS
        ]
        metrics = httpx.get(url + "/metrics", timeout=30).text
    assert "vllm:spec_decode_num_drafts" not in metrics  # no speculation: no counters
    yield answers


def test_suffix_speculation_is_lossless_and_watch_equals_the_counters(
    target: Path,
    plain_answers: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = VllmSettings(
        target, SUFFIX, extra_args=("--per-request-spec-decode-metrics", "summary")
    )
    with vllm_server(settings, log=tmp_path / "vllm-suffix.log") as url:
        answers = [chat(url, target, p, MAX_TOKENS) for p in PROMPTS]
        assert main(["watch", url, "--once", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        counters = read_exposition(httpx.get(url + "/metrics", timeout=30).text).counts
    texts = [a["choices"][0]["message"]["content"] for a in answers]
    assert texts == plain_answers  # greedy: speculation changes the speed, not the text

    per_request = [a["metrics"]["speculative_decoding"] for a in answers]
    steps = sum(m["num_spec_steps"] for m in per_request)
    drafted = sum(m["num_draft_tokens"] for m in per_request)
    accepted = sum(m["num_accepted_draft_tokens"] for m in per_request)
    # acceptance_histogram[j]: steps that accepted exactly j draft tokens, so position
    # j + 1 was kept by the steps that accepted more than j.
    kept_at = [
        sum(sum(m["acceptance_histogram"][j + 1 :]) for m in per_request)
        for j in range(SUFFIX["num_speculative_tokens"])
    ]
    assert accepted > 0  # counting to 30 repeats itself: suffix drafts get accepted
    assert counters is not None
    assert (counters.steps, counters.num_draft_tokens, counters.accepted) == (
        steps,
        drafted,
        accepted,
    )
    assert counters.accepted_at == kept_at
    assert report["engine"] == "vllm" and report["window"] == "since start"
    assert report["k"] == SUFFIX["num_speculative_tokens"]
    assert (report["steps"], report["draft_tokens"], report["accepted"]) == (
        steps,
        drafted,
        accepted,
    )
    assert report["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert report["acceptance_by_position"] == pytest.approx([k / steps for k in kept_at])
    # No cost profile given: acceptance is reported, no speedup predicted.
    assert report["advice"] is None
    assert any("speedup not predicted" in note for note in report["notes"])
