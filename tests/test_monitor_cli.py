"""``generate --policy ... --trace`` then ``report`` on the real default model (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.monitor import PLOTS, read_trace


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["threshold", "cost"])
def test_generate_traces_and_report_reads_it(
    policy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "run.jsonl"
    argv = ["generate", "--chat", "Count from one to ten.", "--max-tokens", "16", "--json"]
    argv += ["--policy", policy, "--trace", str(trace), "--compare"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == policy and report["identical_to_plain"] is True
    assert isinstance(report["speculative"]["fallback_steps"], dict)
    (request,) = read_trace(trace)
    assert request.info["policy"] == policy
    assert request.info["baseline_tokens_per_second"] > 0
    emitted = [t for step in request.steps for t in step.record.emitted]
    assert len(emitted) == report["speculative"]["tokens"] == 16
    assert main(["report", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "(given)" in out  # the --compare rate recorded in the trace
    assert all((tmp_path / "run_report" / name).is_file() for name in PLOTS)
