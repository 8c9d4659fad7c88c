"""``spectune tune --engine vllm`` end to end on a real vLLM (``make vllm``), CI-sized: two
candidates (off and suffix, K = 3), concurrency 1 and 2, two rounds of short answers to
prompts that repeat themselves; then a vLLM server starts with the schedule written (or,
where the guard kept speculation off, the schedule confirmed) and answers. Seven server
starts, eager: a few minutes on two cores. Nothing here is a speed measurement."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _vllm import LIVE, chat
from spectune.cli import main
from spectune.engines.costs import load_costs
from spectune.engines.hf_folder import convert_target
from spectune.engines.vllm import VllmSettings, vllm_server
from spectune.engines.vllm.tune_schedule import MAX_BATCH

pytestmark = LIVE

COUNTING = [
    "Count from 1 to 20, separated by commas.",
    "List the numbers from 10 to 30, one per line.",
    "Write the even numbers from 2 to 40, separated by spaces.",
    "Repeat the word 'blue' ten times.",
    "Count down from 25 to 5, separated by commas.",
    "Write the multiples of 5 up to 60, separated by commas.",
    "List the letters of the alphabet, separated by commas.",
    "Count from 100 to 115, one per line.",
    "Write the odd numbers from 1 to 31, separated by spaces.",
    "Repeat the phrase 'good morning' six times.",
    "List the months of the year, separated by commas.",
    "Name the days of the week, one per line.",
]


def test_tune_writes_a_schedule_vllm_accepts(tmp_path: Path) -> None:
    target = tmp_path / "target"
    convert_target("default", target)
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("w") as f:
        for i, text in enumerate(COUNTING):
            split = "dev" if i < 4 else "test"
            f.write(json.dumps({"category": "counting", "prompt": text, "split": split}) + "\n")
    out = tmp_path / "config.json"
    argv = [
        "tune", "--engine", "vllm", "--quick", "--methods", "suffix",
        "--target", str(target), "--prompts", str(prompts),
        "--concurrency", "1,2", "--per-cell", "2", "--rounds", "2",
        "--max-tokens", "32", "--noise-z", "0", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0

    report = json.loads(out.with_name("config-report.json").read_text())
    assert list(report["screen"]) == ["off", "suffix depth 24 p>=0.1 cache on K=3"]
    assert report["levels"] == [1, 2] and report["rounds"] == 2
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "## confirmation" in out.with_name("config-report.md").read_text()
    written = json.loads(out.read_text())
    assert written == report["speculative_config"]
    if report["family"] is not None:  # the screen found suffix faster somewhere
        confirmed = report["confirm"]["schedule"]
        assert confirmed["greedy_equal_to_off"] == "8/8"  # greedy: the same answers
        schedule = confirmed["config"]["num_speculative_tokens_per_batch_size"]
        # suffix takes one K at every batch size (vLLM's suffix proposer asserts it)
        assert schedule == [[1, MAX_BATCH, confirmed["config"]["num_speculative_tokens"]]]
    # What was written, else what was confirmed, else (suffix never beat off in this run)
    # the shape the tuner writes for suffix: vLLM must decode with it past the levels.
    config = written or (report["family"] and report["confirm"]["schedule"]["config"])
    config = config or {
        "method": "suffix",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, MAX_BATCH, 3]],
    }
    assert "num_speculative_tokens_per_batch_size" in config
    if written is not None:
        costs = load_costs(out.with_name("config-costs.json"))
        assert costs.engine == "vllm" and costs.verify[0] == 1
    with vllm_server(VllmSettings(target, config), log=tmp_path / "check.log") as url:
        with ThreadPoolExecutor(3) as pool:  # a batch past the largest level decodes too
            answers = list(pool.map(lambda text: chat(url, target, text, 24), COUNTING[:3]))
    assert all(answer["choices"][0]["message"]["content"] for answer in answers)
