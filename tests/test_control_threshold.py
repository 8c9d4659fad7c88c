"""The threshold policy: scripted acceptance sequences -> expected K trajectories."""

from __future__ import annotations

import pytest
import torch

from spectune.control import ThresholdConfig, ThresholdK, make_policy
from spectune.control.replay import drive, fake_record
from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams

# Defaults: window 4, patience 2 -> a move needs 4 steps to fill the window and one more
# agreeing decision, so K holds for 5 steps after each move.
HOLD = 5


def threshold(**options: object) -> ThresholdK:
    policy = make_policy("threshold", {"checks": [], **options})
    assert isinstance(policy, ThresholdK)
    return policy


def test_goes_up_one_step_at_a_time_and_clamps_at_8() -> None:
    expected = [4] * HOLD + [5] * HOLD + [6] * HOLD + [7] * HOLD + [8] * 12
    assert drive(threshold(), [1.0] * len(expected)) == expected


def test_goes_down_and_clamps_at_1() -> None:
    expected = [4] * HOLD + [3] * HOLD + [2] * HOLD + [1] * 12
    assert drive(threshold(), [0.0] * len(expected)) == expected


def test_holds_inside_the_band() -> None:
    # 3 of 4 accepted = 75%, between 60% and 80%.
    assert drive(threshold(), [0.75] * 40) == [4] * 40


def test_band_edges_are_strict() -> None:
    # Exactly 80% does not raise and exactly 60% does not lower ("above", "below").
    assert set(drive(threshold(initial_k=5), [0.8] * 30)) == {5}
    assert set(drive(threshold(initial_k=5), [0.6] * 30)) == {5}


def test_temperature_above_0_7_is_one_step_more_conservative() -> None:
    hot = make_policy("threshold", {"checks": []}, params=SamplingParams(temperature=0.8))
    assert hot.plan().k == 3
    trajectory = drive(hot, [1.0] * 40)
    assert max(trajectory) == 7 and trajectory[-1] == 7
    cold = make_policy("threshold", {"checks": []}, params=SamplingParams(temperature=0.7))
    assert cold.plan().k == 4  # 0.7 itself is not above 0.7
    # At the bottom the rule cannot go below one token.
    hot_low = make_policy(
        "threshold", {"checks": [], "initial_k": 1}, params=SamplingParams(temperature=1.0)
    )
    assert drive(hot_low, [0.0] * 10) == [1] * 10
    # It steps down from min_k: K in [2, 3] drafts 2 cold and 1 hot, whatever acceptance.
    bounds = {"checks": [], "min_k": 2, "max_k": 3, "initial_k": 2}
    for temperature, k in ((0.0, 2), (1.0, 1)):
        bounded = make_policy("threshold", bounds, params=SamplingParams(temperature=temperature))
        assert drive(bounded, [0.0] * 10) == [k] * 10


def test_alternating_good_and_bad_steps_do_not_oscillate() -> None:
    # A per-step rule would go up after every 100% step and down after every 25% one.
    for good, bad in ((1.0, 0.5), (1.0, 0.25), (0.75, 0.5)):
        assert drive(threshold(), [good, bad] * 30) == [4] * 60


def test_k_never_moves_twice_within_the_hold_on_random_sequences() -> None:
    generator = torch.Generator().manual_seed(7)
    for _ in range(20):
        script = torch.rand(200, generator=generator).tolist()
        trajectory = drive(threshold(), script)
        changes = [i for i in range(1, len(trajectory)) if trajectory[i] != trajectory[i - 1]]
        assert all(abs(trajectory[i] - trajectory[i - 1]) == 1 for i in changes)
        assert all(b - a >= HOLD for a, b in zip(changes, changes[1:], strict=False))


def test_patience_and_window_are_configurable() -> None:
    # window 1, patience 1: the raw rule, one move per step.
    assert drive(threshold(window=1, patience=1), [1.0] * 6) == [4, 5, 6, 7, 8, 8]
    assert drive(threshold(window=2, patience=3), [1.0] * 6) == [4, 4, 4, 4, 5, 5]


def test_steps_without_draft_tokens_are_ignored() -> None:
    policy = threshold()
    for _ in range(20):
        policy.observe(fake_record(0, 0))
    assert policy.plan().k == 4 and len(policy.window) == 0


@pytest.mark.parametrize(
    "options",
    [
        {"initial_k": 9},
        {"min_k": 0},
        {"max_k": 33},
        {"raise_above": 0.5, "lower_below": 0.6},
        {"window": 0},
    ],
)
def test_invalid_configurations_are_typed_errors(options: dict[str, object]) -> None:
    with pytest.raises(InvalidParameterError):
        make_policy("threshold", options)


def test_config_defaults_are_the_seed_checklist() -> None:
    cfg = ThresholdConfig()
    assert (cfg.initial_k, cfg.min_k, cfg.max_k) == (4, 1, 8)
    assert (cfg.raise_above, cfg.lower_below, cfg.hot_temperature) == (0.8, 0.6, 0.7)
