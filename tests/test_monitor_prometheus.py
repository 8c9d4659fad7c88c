"""Prometheus exposition: parses, names in vLLM's spec_decode style, values match."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spectune.control.replay import fake_record
from spectune.monitor import Monitor

P = "spectune_spec_decode"


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def feed(monitor: Monitor) -> None:
    watch = monitor.request()
    watch.observe(fake_record(4, 2, draft_time=0.002, target_time=0.01))  # rejected at 3
    watch.observe(fake_record(4, 4, draft_time=0.002, target_time=0.01))
    watch.observe(fake_record(0, 0, target_time=0.01, fallback="local: acceptance low"))
    watch.observe(fake_record(0, 0, target_time=0.01, fallback="local: acceptance low"))


def test_metrics_parse_and_match_the_snapshot() -> None:
    monitor = Monitor(registry=CollectorRegistry(), baseline_tokens_per_second=100.0)
    feed(monitor)
    assert monitor.exporter is not None
    values = samples(monitor.exporter.registry)
    snap = monitor.snapshot()
    assert values[(f"{P}_num_steps_total", ())] == 4 == snap.steps
    assert values[(f"{P}_num_draft_tokens_total", ())] == 8 == snap.drafted
    assert values[(f"{P}_num_accepted_tokens_total", ())] == 6 == snap.accepted
    assert values[(f"{P}_num_emitted_tokens_total", ())] == 10 == snap.emitted
    assert values[(f"{P}_requests_total", ())] == 1
    per_pos = [
        values[(f"{P}_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
        for i in range(1, 5)
    ]
    assert per_pos == [2, 2, 1, 1] == list(snap.accepted_per_position)
    assert values[(f"{P}_fallback_events_total", (("kind", "local"),))] == 1
    assert values[(f"{P}_fallback_steps_total", (("kind", "local"),))] == 2
    assert values[(f"{P}_fallback_events_total", (("kind", "token"),))] == 1
    assert values[(f"{P}_fallback_events_total", (("kind", "global"),))] == 0  # exposed at 0
    assert values[(f"{P}_acceptance_rate", ())] == 0.75
    assert values[(f"{P}_fallback_frequency", ())] == 0.5
    assert values[(f"{P}_k", ())] == 0
    assert values[(f"{P}_draft_time_seconds_count", ())] == 4
    assert math.isclose(values[(f"{P}_target_time_seconds_sum", ())], 0.04)
    speedup = values[(f"{P}_estimated_speedup", ())]
    assert speedup == snap.window.estimated_speedup


def test_unknown_rates_are_nan_and_registries_are_independent() -> None:
    first = Monitor(registry=CollectorRegistry())
    second = Monitor(registry=CollectorRegistry())  # no clash: separate registries
    feed(first)
    assert first.exporter is not None and second.exporter is not None
    values = samples(second.exporter.registry)
    assert values[(f"{P}_num_steps_total", ())] == 0
    assert math.isnan(values[(f"{P}_acceptance_rate", ())])
    assert math.isnan(samples(first.exporter.registry)[(f"{P}_estimated_speedup", ())])
