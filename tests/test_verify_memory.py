"""Verification peak memory: measured every step, carried to traces, reports and Prometheus.

On the CPU the figure is computed from the verification's tensor shapes (see
``spectune.models.devices.VerifyMemory``), so it is exact and these tests compare numbers; the
CUDA path (allocator peak) runs only where a GPU is present.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from spectune.control.base import FixedK
from spectune.control.replay import fake_record
from spectune.decode.batch import BatchEngine
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import NgramDrafter, TreeDrafter, TreeShape
from spectune.drafters.batched import PerRow
from spectune.drafters.scripted import ScriptedDrafter
from spectune.models.devices import VerifyMemory
from spectune.models.llama import LlamaLM
from spectune.monitor import Monitor, TraceWriter, analyse_trace, read_trace
from spectune.monitor.report import peak_by_k
from spectune.records import StepRecord
from spectune.sampling import SamplingParams

PROMPT = [1, 5, 9, 13, 7, 2]


def peaks_at(target: LlamaLM, k: int, temperature: float = 0.0) -> list[int]:
    drafter = ScriptedDrafter(lambda context, n: [3] * n, vocab_size=target.info.vocab_size)
    engine = SpeculativeEngine(target, drafter)
    params = SamplingParams(temperature=temperature, max_tokens=12, seed=0)
    steps = engine.run(PROMPT, params, policy=FixedK(k)).steps
    assert all(s.verify_peak_bytes is not None for s in steps)
    return [s.verify_peak_bytes or 0 for s in steps]


def test_every_step_measures_and_the_figure_grows_with_k(toy_target: LlamaLM) -> None:
    first = {k: peaks_at(toy_target, k)[0] for k in (0, 1, 2, 4, 8)}
    assert list(first.values()) == sorted(set(first.values()))  # strictly increasing in K
    # CPU figure, from shapes: fp32 logits [k + 1, vocab] and the bool mask [k + 1, context].
    vocab, context = toy_target.info.vocab_size, len(PROMPT) - 1
    assert first[4] == 5 * vocab * 4 + 5 * (context + 5)


def test_sampling_doubles_the_logit_bytes(toy_target: LlamaLM) -> None:
    greedy, sampled = peaks_at(toy_target, 3)[0], peaks_at(toy_target, 3, temperature=0.7)[0]
    assert sampled - greedy == 4 * toy_target.info.vocab_size * 4  # the probabilities


def test_the_figure_grows_with_tree_size(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    first = {}
    for nodes in (2, 6, 12):
        engine = SpeculativeEngine(toy_target, TreeDrafter(toy_draft, TreeShape(2, nodes)))
        steps = engine.run(PROMPT, SamplingParams(max_tokens=4), policy=FixedK(4)).steps
        first[nodes] = steps[0].verify_peak_bytes
    assert first[2] is not None and first[6] is not None and first[12] is not None
    assert first[2] < first[6] < first[12]


def test_batched_steps_measure_the_whole_pass(toy_target: LlamaLM) -> None:
    engine = BatchEngine(
        toy_target, PerRow(NgramDrafter), max_batch=2, policy_factory=lambda p: FixedK(2)
    )
    params = SamplingParams(max_tokens=4)
    engine.add("a", PROMPT, params)
    engine.add("b", [*PROMPT, 4], params)
    updates = engine.step()
    peaks = {u.record.verify_peak_bytes for u in updates}
    assert len(peaks) == 1 and next(iter(peaks)) is not None  # one pass, one figure


def monitored(peaks: list[int | None]) -> Monitor:
    monitor = Monitor(registry=CollectorRegistry(), window=2)
    watch = monitor.request()
    for peak in peaks:
        record = fake_record(2, 1)
        watch.observe(StepRecord(**{**record.__dict__, "verify_peak_bytes": peak}))
    return monitor


def test_prometheus_gauge_is_the_window_maximum() -> None:
    monitor = monitored([9000, 100, 300])
    assert monitor.exporter is not None
    text = generate_latest(monitor.exporter.registry).decode()
    assert "# TYPE spectune_spec_decode_verify_peak_bytes gauge" in text
    assert "spectune_spec_decode_verify_peak_bytes 300.0" in text  # window of 2: 100, 300
    snap = monitor.snapshot()
    assert (snap.verify_peak_bytes, snap.window_verify_peak_bytes) == (9000, 300)


def test_prometheus_gauge_is_nan_when_unmeasured() -> None:
    monitor = monitored([None, None])
    assert monitor.exporter is not None
    text = generate_latest(monitor.exporter.registry).decode()
    (line,) = [x for x in text.splitlines() if x.startswith("spectune_spec_decode_verify_peak")]
    assert math.isnan(float(line.split()[-1]))


def test_trace_and_report_carry_the_figure(toy_target: LlamaLM, tmp_path: object) -> None:
    drafter = ScriptedDrafter(lambda context, n: [3] * n, vocab_size=toy_target.info.vocab_size)
    engine = SpeculativeEngine(toy_target, drafter)
    buffer = io.StringIO()
    monitor = Monitor(trace=TraceWriter(buffer))
    for k in (1, 4):
        watch = monitor.request()
        records = engine.generate(PROMPT, SamplingParams(max_tokens=6), policy=FixedK(k))
        expected = [r.verify_peak_bytes for r in watch.watch(records)]
    path = tmp_path / "t.jsonl"  # type: ignore[operator]
    path.write_text(buffer.getvalue())
    requests = read_trace(path)
    assert [s.record.verify_peak_bytes for s in requests[1].steps] == expected
    peaks = peak_by_k(analyse_trace(requests))
    assert set(peaks) <= {0, 1, 2, 3, 4} and peaks[1] < peaks[4]


def test_trace_refuses_a_bad_figure(tmp_path: object) -> None:
    from spectune.monitor.trace import TraceError

    path = tmp_path / "bad.jsonl"  # type: ignore[operator]
    event = (
        '{"event":"step","request":"0","index":0,"k":1,"drafted":1,"accepted":1,'
        '"emitted":[1,2],"draft_time":0,"target_time":0,"step_time":0,'
        '"verify_peak_bytes":-3}'
    )
    path.write_text(event + "\n")
    with pytest.raises(TraceError, match="verify_peak_bytes must be a non-negative integer"):
        read_trace(path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_allocator_peak_grows_with_the_pass() -> None:
    device = torch.device("cuda")
    peaks = []
    for rows in (1, 64, 512):
        probe = VerifyMemory(device)
        x = torch.ones(rows, 4096, device=device)
        y = (x @ x.T).sum()
        del x
        peaks.append(probe.peak_bytes(rows=rows, context=rows, vocab=1, sampled=False))
        del y
    assert peaks[0] < peaks[1] < peaks[2]
    assert peaks[2] >= 512 * 4096 * 4
