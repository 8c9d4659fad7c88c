"""``spectune advise --traces``: recorded traffic as the prompts, at its temperatures, and
per-position acceptance per temperature and category."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spectune.advise.advisor import _positions
from spectune.advise.measure import verify_interleaved
from spectune.advise.traffic import load_traffic
from spectune.cli import main
from spectune.control.replay import fake_record
from spectune.drafters.scripted import ScriptedDrafter
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.models.toy import perturbed, toy_model
from spectune.monitor.trace import TraceError, TraceWriter, read_trace
from spectune.records import SpecCounts
from spectune.server.testing import toy_tokenizer


def write_trace(path: Path, requests: list[tuple[str, dict[str, Any]]]) -> None:
    """One drafting step per request, with the given request info."""
    with TraceWriter(path) as writer:
        for request, info in requests:
            writer.request_started(request, info)
            writer.step(request, fake_record(2, 1), None)


def test_traffic_takes_recorded_prompts_evenly_and_once(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    write_trace(
        folder / "chat.jsonl",
        [
            ("a", {"temperature": 0.7, "prompt": [5, 6, 7], "target": "toy"}),
            ("b", {"temperature": 0.7, "prompt": [5, 6, 7]}),  # a retry: counted once
            ("c", {"temperature": 0.0, "prompt": [8, 9]}),
            ("d", {"temperature": 0.7}),  # recorded before prompts were
        ],
    )
    write_trace(
        folder / "code.jsonl",
        [(f"r{i}", {"temperature": 0.7, "prompt": [10 + i, 3]}) for i in range(10)],
    )
    (folder / "notes.txt").write_text("not a trace")
    traffic = load_traffic(folder, per_file=4)
    # Four of code's ten, spread over the file: 0, 2, 5, 7.
    assert [row[0] for row in traffic.prompts] == [
        "chat:a", "chat:c", "code:r0", "code:r2", "code:r5", "code:r7",
    ]  # fmt: skip
    assert [row[1] for row in traffic.prompts] == ["chat"] * 2 + ["code"] * 4
    assert traffic.prompts[0][2] == [5, 6, 7]
    assert traffic.temperatures == (0.7, 0.0)  # five requests at 0.7, one at 0
    assert any("chat.jsonl: 1 request(s) carry no prompt" in n for n in traffic.notes)
    traffic.check("toy", 64)
    with pytest.raises(TraceError, match="recorded on 'toy', not on the target 'other'"):
        traffic.check("other", 64)
    with pytest.raises(TraceError, match="code:r7: prompt token 17 is outside"):
        traffic.check("toy", 16)
    assert load_traffic(folder / "chat.jsonl", per_file=1).prompts[0][0] == "chat:a"


def test_traffic_bad_input_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    old = tmp_path / "old.jsonl"
    write_trace(old, [("a", {"temperature": 0.0})])
    bad = tmp_path / "bad.jsonl"
    write_trace(bad, [("a", {"prompt": "hello"})])
    for path, message in (
        (empty, "no *.jsonl step traces in this folder"),
        (tmp_path / "missing", "no such file or folder"),
        (old, "no request with a recorded prompt"),
        (bad, "'prompt' is not a list of token ids"),
    ):
        with pytest.raises(TraceError, match="^.*$") as info:
            load_traffic(path, per_file=4)
        assert message in str(info.value) and "\n" not in str(info.value)


def test_sampled_probe_runs_repeat_and_pool_per_category(toy_target: LlamaLM) -> None:
    vocab = toy_target.info.vocab_size
    shifted = ScriptedDrafter(
        lambda ctx, k: [(ctx[-1] + j) % vocab for j in range(k)], vocab_size=vocab
    )
    prompts = [[1, 30, 31, 32], [1, 7, 8, 9], [1, 40, 41]]
    runs = [
        verify_interleaved(toy_target, [("d", shifted, 2)], prompts, 10, temperature=0.7)[0]
        for _ in range(2)
    ]
    # Seeded per prompt: the same samples twice.
    assert [c.emitted for c in runs[0].per_prompt] == [c.emitted for c in runs[1].per_prompt]
    assert [c.accepted for c in runs[0].per_prompt] == [c.accepted for c in runs[1].per_prompt]
    pooled = SpecCounts()
    for counts in runs[0].per_prompt:
        pooled.merge(counts)
    assert pooled.accepted == runs[0].counts.accepted and len(runs[0].per_prompt) == 3
    positions = _positions({0.7: runs[:1]}, ["a", "b", "a"], 2)["d"]
    assert set(positions.pooled) == {"0.7"} and len(positions.pooled["0.7"]) == 2
    assert set(positions.by_category["0.7"]) == {"a", "b"}
    assert all(0.0 <= c <= 1.0 for c in positions.pooled["0.7"])


@pytest.mark.slow  # two toy models, traced generations, then advise: ~1 min on two cores
def test_advise_replays_traced_traffic(tmp_path: Path) -> None:
    target, draft = tmp_path / "toy", tmp_path / "draft"
    save_native(toy_model(0, scale=3.0), target)
    toy_tokenizer(target)
    save_native(perturbed(toy_model(0, scale=3.0), 0.3), draft)
    toy_tokenizer(draft)
    traces = tmp_path / "traces"
    traces.mkdir()
    base = ["--target", str(target), "--draft", "ngram", "--max-tokens", "12"]
    for i, (prompt, temperature) in enumerate(
        (("w1 w2 w3 w1 w2", "0.7"), ("w2 w3 w1", "0.7"), ("w3 w1 w2 w3", "0"), ("w1 w3", "0.7"))
    ):
        argv = [*base, "--temperature", temperature, "--seed", str(i)]
        assert main(["generate", prompt, *argv, "--trace", str(traces / f"t{i}.jsonl")]) == 0
    (request,) = read_trace(traces / "t0.jsonl")
    assert isinstance(request.info["prompt"], list) and request.info["prompt"]
    out = tmp_path / "report"
    argv = ["advise", "--target", str(target), "--draft", str(draft), "--traces", str(traces)]
    argv += ["--max-tokens", "8", "--top", "1", "--no-tune", "--verify-prompts", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    data = json.loads((out / "advice.json").read_text())
    assert data["settings"]["temperatures"] == [0.7, 0.0]  # the traffic's, most frequent first
    (candidate,) = data["candidates"]
    assert set(candidate["position_acceptance"]) == {"0.7", "0.0"}
    categories = {"t0", "t1", "t2", "t3"}  # one per trace file
    assert set(candidate["position_acceptance_by_category"]["0.7"]) <= categories
    assert set(candidate["acceptance_by_category"]["0.7"]) == categories
