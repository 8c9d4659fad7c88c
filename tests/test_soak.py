"""The soak and fault test, short variant (tiny model, about a minute): mixed traffic at
the concurrency limit with random disconnects and drafters that raise, return NaN or
hang past the draft deadline; SIGTERM with requests in flight; corrupt model files at
start-up. Loopback only. The long variant on the real model: docs/serving.md."""

from __future__ import annotations

import pytest

from spectune.server.soak import SoakConfig, run_soak

pytestmark = pytest.mark.slow


def test_short_soak() -> None:
    report = run_soak(SoakConfig(seconds=10.0))
    print("\n".join(report.lines()))  # the figures, with -s
    assert report.problems() == []
    # Each fault happened, so passing means something.
    assert report.sent >= 50 and report.answered >= report.sent // 2
    assert report.disconnected > 0 and report.cancelled > 0
    assert report.cancelled <= report.disconnected  # only abandoned requests are cancelled
    assert report.fallbacks.get("drafter_error", 0) > 0
    assert report.fallbacks.get("draft_deadline", 0) > 0
    assert report.greedy_compared > 0 and report.greedy_mismatches == 0
    assert report.sigterm["finished"] + report.sigterm["clean_error"] > 0
    assert report.refused_after_sigterm > 0 and report.accepted_after_sigterm == 0
    assert set(report.startup.values()) == {"ok"}
