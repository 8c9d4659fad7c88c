"""The measured-cost model every K decision rests on: the curve, S(K), the best K."""

from __future__ import annotations

import pytest

from spectune.control.costs import (
    CostCurve,
    ewma,
    expected_tokens_per_step,
    optimal_k,
    predicted_speedup,
)

CURVE = CostCurve((1, 2, 4), (0.010, 0.012, 0.016))


def test_curve_interpolates_and_extrapolates() -> None:
    assert CURVE.time(1) == 0.010
    assert CURVE.time(3) == pytest.approx(0.014)
    assert CURVE.time(6) == pytest.approx(0.020)  # the last segment's slope, continued
    assert CURVE.relative(3) == pytest.approx(1.6)  # a forward over 4 tokens / over 1


def test_expected_tokens_per_step() -> None:
    assert expected_tokens_per_step(0.0, 4) == 1.0  # only the target's own token
    assert expected_tokens_per_step(1.0, 4) == 5.0  # every draft token and the bonus
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_predicted_speedup_and_its_verification_cost() -> None:
    assert predicted_speedup(0.9, 0.1, CURVE, 0) == 1.0
    one_pass = predicted_speedup(0.8, 0.1, CURVE, 3)
    assert one_pass == pytest.approx(expected_tokens_per_step(0.8, 3) / (0.3 + 1.6))
    assert predicted_speedup(0.8, 0.1, CURVE, 3, verify_cost=CURVE.relative(3)) == one_pass
    assert predicted_speedup(0.8, 0.1, CURVE, 3, verify_cost=1.0) > one_pass


def test_optimal_k() -> None:
    assert optimal_k(0.0, 0.1, CURVE) == (0, 1.0)  # nothing is ever accepted: plain
    k, speedup = optimal_k(0.9, 0.05, CURVE, max_k=8)
    assert 1 <= k <= 8 and speedup > 1.0
    assert speedup == max(predicted_speedup(0.9, 0.05, CURVE, j) for j in range(9))


def test_ewma() -> None:
    assert ewma(None, 3.0, 0.2) == 3.0
    assert ewma(1.0, 3.0, 0.25) == pytest.approx(1.5)


def test_a_dip_in_the_measured_curve_is_pooled_away() -> None:
    from spectune.control.costs import nondecreasing

    rising = (1.0, 1.1, 1.3)
    assert nondecreasing(rising) == rising  # already non-decreasing: unchanged
    # v(3) measured under v(2) (noise): the pair is pooled into its mean, the rest kept.
    assert nondecreasing((1.0, 1.2, 1.0, 1.8)) == pytest.approx((1.0, 1.1, 1.1, 1.8))
