"""The step trace round-trips; ``spectune report`` draws its PNGs and judges health."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.control import make_policy
from spectune.control.replay import fake_record
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import ScriptedDrafter
from spectune.models.llama import LlamaLM
from spectune.monitor import (
    PLOTS,
    Monitor,
    Rates,
    TraceError,
    TraceWriter,
    analyse_trace,
    health,
    plot_report,
    read_trace,
)
from spectune.monitor.trace import to_json
from spectune.records import StepRecord
from spectune.sampling import SamplingParams

PROMPT = [1, 30, 31, 32]  # the toy target decodes 64 tokens from it without EOS
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def record_trace(target: LlamaLM, path: Path, requests: int = 2) -> list[list[object]]:
    """Greedy requests with a drafter right on even steps' first token only (so the
    local fallback fires), traced; returns each request's records."""
    params = SamplingParams(max_tokens=40)
    expected = SpeculativeEngine(target).run(PROMPT, params).tokens

    def script(context: Sequence[int], k: int) -> list[int]:
        start = len(context) - len(PROMPT)
        tokens = list(expected[start : start + k])
        return tokens[:1] + [(t + 1) % 64 for t in tokens[1:]]  # 1 of k accepted

    engine = SpeculativeEngine(target, ScriptedDrafter(script, vocab_size=64))
    out = []
    with TraceWriter(path) as trace:
        monitor = Monitor(trace=trace)
        for _ in range(requests):
            policy = make_policy("threshold", params=params)
            watch = monitor.request(policy=policy, info={"policy": "threshold"})
            out.append(list(watch.watch(engine.generate(PROMPT, params, policy=policy))))
    return out  # type: ignore[return-value]


def test_trace_round_trips_every_record(toy_target: LlamaLM, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    runs = record_trace(toy_target, path)
    requests = read_trace(path)
    assert [r.request for r in requests] == ["0", "1"]
    for request, records in zip(requests, runs, strict=True):
        assert [s.record for s in request.steps] == records
        assert request.info == {"policy": "threshold"}
        assert request.summary is not None and request.summary["steps"] == len(records)
        states = [s.policy for s in request.steps]
        assert all(state is not None and "next_k" in state for state in states)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = {e["fallback_kind"] for e in events if e["event"] == "step"}
    assert "local" in kinds
    step = next(e for e in events if e["event"] == "step")
    assert step["overhead_time"] == pytest.approx(
        step["step_time"] - step["draft_time"] - step["target_time"]
    )


def test_report_draws_its_pngs(toy_target: LlamaLM, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    runs = record_trace(toy_target, path)
    report = analyse_trace(read_trace(path))
    assert len(report.k) == sum(len(r) for r in runs)
    assert report.request_starts == (0, len(runs[0]))
    assert report.snapshot.fallback_events["local"] >= 2
    paths = plot_report(report, tmp_path / "charts")
    assert [p.name for p in paths] == list(PLOTS)
    for png in paths:
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000


def test_report_command(
    toy_target: LlamaLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    record_trace(toy_target, path, requests=1)
    assert main(["report", str(path), "--baseline-tps", "1e9"]) == 0
    out = capsys.readouterr().out
    for label in ("acceptance rate", "draft latency share", "speedup", "fallback frequency"):
        assert label in out
    assert "low" in out  # 1 of 4 accepted, and a speedup over an impossible baseline
    for name in PLOTS:
        assert (tmp_path / "run_report" / name).read_bytes()[:8] == PNG_MAGIC


def test_bad_traces_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    good = {"event": "step", "request": "0", **to_json(fake_record(4, 2))}
    for broken in ({"k": "four"}, {"draft_time": None}, {"emitted": "abc"}, {"index": True}):
        bad.write_text(json.dumps({**good, **broken}) + "\n")
        with pytest.raises(TraceError, match="bad.jsonl:1"):
            read_trace(bad)
    del good["accepted"]
    bad.write_text(json.dumps(good) + "\n")
    with pytest.raises(TraceError):
        read_trace(bad)
    bad.write_text("not json\n")
    assert main(["report", str(bad)]) == 2
    assert "not a spectune trace event" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty)]) == 2


def test_health_verdicts() -> None:
    def rates(acceptance: float | None, share: float, speedup: float | None, fb: float) -> Rates:
        return Rates(acceptance, 2.0, share, 10.0, speedup, fb)

    def verdicts(r: Rates) -> list[str]:
        return [c.status for c in health(r)]

    assert verdicts(rates(0.7, 0.2, 2.0, 0.0)) == ["ok", "ok", "ok", "ok"]
    assert verdicts(rates(0.5, 0.4, 1.2, 0.05)) == ["low", "high", "low", "high"]
    assert verdicts(rates(0.9, 0.1, 3.0, 0.01)) == ["high", "ok", "high", "ok"]
    assert verdicts(rates(None, 0.1, None, 0.0)) == ["n/a", "ok", "n/a", "ok"]
    assert verdicts(rates(0.85, 0.399, 2.5, 0.049)) == ["ok", "ok", "ok", "ok"]


def test_trace_writer_accepts_a_stream(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with open(path, "w") as handle:
        writer = TraceWriter(handle)
        writer.request_started("a", {"x": 1})
        writer.step("a", fake_record(2, 1), {"k": 2})
        writer.close()  # not ours to close
        assert not handle.closed
    (request,) = read_trace(path)
    assert request.steps[0].record == fake_record(2, 1) and request.steps[0].policy == {"k": 2}


def test_a_step_event_holds_every_record_field_as_to_json_writes_it(tmp_path: Path) -> None:
    record = StepRecord(
        index=3,
        k=2,
        num_draft_tokens=2,
        accepted=1,
        emitted=(5, 6),
        draft_time=0.001,
        target_time=0.01,
        step_time=0.0125,
        fallback="local: acceptance below 50%",
        finish_reason="eos",
        verify_groups=2,
        tree_depth=2,
        verify_peak_bytes=1024,
        shadow_hit=True,
    )
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, autoflush=False) as writer:
        writer.step("a", record, {"k": 2})
        assert path.read_text() == ""  # buffered until flushed
        writer.flush()
        event = json.loads(path.read_text())
    assert {name: event[name] for name in to_json(record)} == to_json(record)
    assert read_trace(path)[0].steps[0].record == record


def test_traces_from_before_the_rename_still_load(tmp_path: Path) -> None:
    """``StepRecord.drafted`` became ``num_draft_tokens``: traces write the new key, and
    a trace that names it ``drafted`` (written before the rename) reads the same."""
    path = tmp_path / "new.jsonl"
    record = fake_record(4, 2, num_draft_tokens=3)
    with TraceWriter(path) as writer:
        writer.step("a", record, None)
    event = json.loads(path.read_text())
    assert event["num_draft_tokens"] == 3 and "drafted" not in event
    event["drafted"] = event.pop("num_draft_tokens")
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps(event) + "\n")
    assert [s.record for r in (read_trace(path), read_trace(old)) for s in r[0].steps] == [
        record,
        record,
    ]
