"""Monitor counters and rates: identities against the engine, window, EWMA, baseline."""

from __future__ import annotations

import dataclasses

import pytest

from spectune.cli.generate import summary
from spectune.control import make_policy
from spectune.control.costs import CostCurve
from spectune.control.replay import fake_record
from spectune.decode.engine import Generation, SpeculativeEngine
from spectune.drafters import ModelDrafter
from spectune.models.llama import LlamaLM
from spectune.monitor import Monitor, SpecStats, fallback_kind
from spectune.sampling import SamplingParams

PROMPT = [1, 30, 31, 32]  # the toy target decodes 64 tokens from it without EOS


@pytest.mark.parametrize("policy_name", ["fixed", "threshold"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_counters_match_the_engine(
    toy_target: LlamaLM, toy_draft: LlamaLM, policy_name: str, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, max_tokens=40, seed=3)
    engine = SpeculativeEngine(toy_target, ModelDrafter(toy_draft))
    monitor = Monitor()
    watch = monitor.request(policy=None)
    policy = make_policy(policy_name, params=params)
    steps = list(watch.watch(engine.generate(PROMPT, params, policy=policy)))
    snap = watch.snapshot()
    emitted = sum(len(s.emitted) for s in steps)
    assert snap.steps == len(steps)
    assert snap.drafted == sum(s.num_draft_tokens for s in steps) > 0
    assert snap.accepted == sum(s.accepted for s in steps) > 0
    assert snap.emitted == emitted
    # Every step emits its accepted tokens plus one (bonus or recovered), before the last
    # step's truncation at EOS (max_tokens never truncates: K is clamped to fit).
    last = steps[-1]
    truncated = last.accepted + 1 - len(last.emitted)
    assert truncated == 0 or last.finish_reason == "eos"
    assert snap.emitted + truncated == snap.accepted + snap.steps
    assert snap.total.mean_accepted_length == pytest.approx((emitted + truncated) / len(steps))
    # Per position: position i accepted only if every earlier one was.
    assert sum(snap.accepted_per_position) == snap.accepted
    assert sum(snap.drafted_per_position) == snap.drafted
    assert list(snap.accepted_per_position) == sorted(snap.accepted_per_position, reverse=True)
    pairs = zip(snap.accepted_per_position, snap.drafted_per_position, strict=True)
    assert all(a <= d for a, d in pairs)
    assert snap.rejections == sum(1 for s in steps if s.accepted < s.num_draft_tokens)
    assert snap.fallback_events.get("token", 0) == snap.rejections
    # Time: draft + target + overhead is the step time.
    assert snap.draft_time + snap.target_time + snap.overhead_time == pytest.approx(snap.step_time)
    assert snap.total.acceptance_rate == pytest.approx(snap.accepted / snap.drafted)
    # The aggregate saw the same steps.
    assert monitor.snapshot().steps == snap.steps and monitor.snapshot().requests == 1


def test_window_and_ewma_rates() -> None:
    stats = SpecStats(window=2, smoothing=0.5)
    records = [
        fake_record(4, 4, draft_time=0.1, target_time=0.3),  # 4/4
        fake_record(4, 0, draft_time=0.1, target_time=0.3),  # 0/4
        fake_record(2, 1, draft_time=0.1, target_time=0.1),  # 1/2
    ]
    for record in records:
        stats.observe(record)
    snap = stats.snapshot()
    assert snap.total.acceptance_rate == pytest.approx(5 / 10)
    assert snap.window.acceptance_rate == pytest.approx(1 / 6)  # the last two steps
    # EWMA weights 0.125, 0.25, 0.5 (the zero start cancels in the ratio).
    weights = (0.125, 0.25, 0.5)
    accepted = sum(w * a for w, a in zip(weights, (4, 0, 1), strict=True))
    ewma = accepted / sum(w * d for w, d in zip(weights, (4, 4, 2), strict=True))
    assert snap.ewma.acceptance_rate == pytest.approx(ewma)
    assert snap.window.draft_share == pytest.approx(0.2 / 0.6)
    assert snap.window.mean_accepted_length == pytest.approx((0 + 1 + 2) / 2)
    assert snap.window.tokens_per_second == pytest.approx(3 / 0.6)
    assert snap.total.estimated_speedup is None and snap.baseline_source is None


def test_baseline_given_measured_predicted() -> None:
    record = fake_record(3, 3, draft_time=0.0, target_time=0.02)  # 4 tokens in 20 ms
    given = SpecStats(baseline_tokens_per_second=100.0)
    given.observe(record)
    assert given.snapshot().total.estimated_speedup == pytest.approx(2.0)
    assert given.snapshot().baseline_source == "given"

    measured = SpecStats()
    measured.observe(record)
    for _ in range(2):
        measured.observe(fake_record(0, 0, target_time=0.01))
    assert measured.snapshot().baseline_source is None  # two plain steps are not enough
    measured.observe(fake_record(0, 0, target_time=0.01))
    snap = measured.snapshot()
    assert snap.baseline_source == "measured"
    assert snap.baseline_tokens_per_second == pytest.approx(100.0)

    predicted = SpecStats(cost_curve=CostCurve((1, 2), (0.0125, 0.013)))
    predicted.observe(record)
    assert predicted.snapshot().baseline_tokens_per_second == pytest.approx(80.0)
    assert predicted.snapshot().baseline_source == "predicted"


def test_fallback_steps_and_events_by_kind() -> None:
    stats = SpecStats()
    reasons = [None, "local: x", "local: x", None, "local: y", "global: z", "global: z"]
    reasons += ["drafter_error: boom", "something else"]
    for reason in reasons:
        stats.observe(fake_record(0 if reason else 2, 0, fallback=reason))
    snap = stats.snapshot()
    assert dict(snap.fallback_steps) == {"local": 3, "global": 2, "drafter_error": 1, "other": 1}
    assert snap.fallback_events["local"] == 2  # it began twice
    assert snap.fallback_events["global"] == 1
    assert snap.fallback_events["token"] == 2  # the two speculative steps were rejected
    assert snap.total.fallback_frequency == pytest.approx(7 / 9)
    assert fallback_kind("cost: no K beats plain decoding") == "cost"
    assert fallback_kind(None) is None


def test_aggregate_across_requests() -> None:
    monitor = Monitor()
    first, second = monitor.request(), monitor.request()
    # Interleaved, as in a server: each request keeps its own fallback transitions.
    first.observe(fake_record(0, 0, fallback="local: a"))
    second.observe(fake_record(0, 0, fallback="local: a"))
    first.observe(fake_record(0, 0, fallback="local: a"))
    second.observe(fake_record(4, 4))
    snap = monitor.snapshot()
    assert snap.requests == 2 and snap.steps == 4
    assert snap.fallback_events["local"] == 2 and snap.fallback_steps["local"] == 3
    assert first.snapshot().steps == 2 and first.snapshot().fallback_events["local"] == 1
    assert second.snapshot().accepted == 4


def test_cli_counts_rejections_as_the_monitor_does() -> None:
    """A tree step that keeps a whole path is no rejection, whatever its node count: the
    CLI's summary and the monitor both compare accepted with the positions tested."""
    steps = [
        dataclasses.replace(fake_record(3, 3, num_draft_tokens=8), tree_depth=3),  # a full path
        dataclasses.replace(fake_record(3, 1, num_draft_tokens=8), tree_depth=3),  # cut short
        fake_record(4, 2),  # a chain cut short
        fake_record(4, 4),  # a chain kept whole
    ]
    gen = Generation(prompt_tokens=[1])
    stats = SpecStats()
    for record in steps:
        gen.add(record)
        stats.observe(record)
    assert summary(gen)["rejections"] == stats.snapshot().rejections == 2
