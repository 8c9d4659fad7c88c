"""The cost policy: K from measured alpha, draft cost and the verification curve."""

from __future__ import annotations

import pytest

from spectune.control import CostK, make_policy
from spectune.control.cost import LearnedCurve
from spectune.control.costs import CostCurve, optimal_k
from spectune.control.registry import shared_calibration
from spectune.control.replay import ScriptedStep, drive, fake_record

# A GPU-like curve: verifying k tokens costs little more than one.
FLAT = CostCurve((1, 2, 4, 8, 16), (0.010, 0.0101, 0.0103, 0.0108, 0.012))
# A compute-bound curve: a forward's time grows with its tokens.
STEEP = CostCurve((1, 2, 4, 8, 16), (0.010, 0.018, 0.034, 0.066, 0.130))


def cost(curve: CostCurve | None = None, **options: object) -> CostK:
    policy = make_policy("cost", {"checks": [], **options}, cost_curve=curve)
    assert isinstance(policy, CostK)
    return policy


def test_all_accepted_with_a_cheap_draft_goes_to_max_k() -> None:
    step = ScriptedStep(1.0, draft_time_per_token=0.0005, target_time=0.0105)
    trajectory = drive(cost(FLAT), [step] * 10)
    assert trajectory[:3] == [4, 4, 4]  # warm-up at the initial K
    assert trajectory[-1] == 8


def test_a_steep_curve_keeps_k_small() -> None:
    # alpha = 0.5: one of two drafted tokens accepted and then a rejection. (A prior of
    # 0.9, weightless, keeps the warm-up at K = 2, where the script needs it.)
    policy = cost(STEEP, initial_k=2, prior_tokens=0.0, prior_alpha=0.9)
    steps = [ScriptedStep(0.5, draft_time_per_token=0.001, target_time=0.018)] * 12
    trajectory = drive(policy, steps)
    assert policy.alpha == pytest.approx(0.5)
    assert set(trajectory[3:]) == {optimal_k(0.5, policy.draft_cost or 0, STEEP)[0]}
    assert trajectory[-1] <= 2


def test_decision_matches_the_speedup_model() -> None:
    policy = cost(FLAT, margin=0.0)

    def on_curve(step: int, k: int) -> ScriptedStep:
        return ScriptedStep(0.5, draft_time_per_token=0.002, target_time=FLAT.time(k + 1))

    drive(policy, on_curve, 10)
    assert policy.alpha is not None and policy.draft_cost is not None
    best_k, best = optimal_k(policy.alpha, policy.draft_cost, FLAT, max_k=8)
    assert policy.plan().k == best_k
    assert policy.predicted == pytest.approx(best)
    assert policy.draft_cost == pytest.approx(0.2)  # 2 ms per token over 10 ms


def test_a_useless_draft_turns_speculation_off_with_a_reason() -> None:
    policy = cost(FLAT, prior_tokens=0.0)
    trajectory = drive(policy, [0.0] * 10)
    assert trajectory[:3] == [4, 4, 4]
    assert trajectory[3:] == [0] * 7
    assert (policy.plan().reason or "").startswith("cost: no K beats plain")


def test_the_prior_decays_and_a_useless_draft_still_turns_off() -> None:
    # alpha starts at prior_alpha (0.3 over 2 tokens); each step of 1 tested, 0 accepted
    # token shrinks it as 0.6 * 0.8^n / (1 + 0.8^n): below the ~0.05 break-even of K = 1 on
    # FLAT (v(1) = 1.01, c = 0.05) after about 10 steps.
    policy = cost(FLAT)
    assert policy.alpha == pytest.approx(0.3)
    trajectory = drive(policy, [0.0] * 16)
    assert trajectory[:3] == [4, 4, 4]
    assert 0 in trajectory[3:12]
    off = trajectory.index(0)
    assert trajectory[off:] == [0] * (16 - off)


def test_three_unlucky_first_steps_do_not_stop_a_draft_that_pays() -> None:
    # Measured on the suffix drafter (question_answering-02): the first three drafted steps
    # accept nothing, the next ones pay. Without the prior alpha is 0 after warm-up and
    # K stays at 0 until the first probe; with it the policy keeps drafting.
    unlucky = [0.0] * 3 + [0.8] * 6
    with_prior = drive(cost(FLAT), unlucky)
    without = drive(cost(FLAT, prior_tokens=0.0), unlucky)
    assert without[3:] == [0] * 6
    assert all(k > 0 for k in with_prior)


def test_off_probes_with_k1_and_comes_back_when_the_draft_pays() -> None:
    policy = cost(FLAT, probe_every=8, prior_tokens=0.0)
    drive(policy, [0.0] * 3)
    assert policy.plan().k == 0
    # Plain steps emit one token each: a probe every 8 plain steps.
    trajectory = drive(policy, [0.0] * 30)
    probes = [i for i, k in enumerate(trajectory) if k == 1]
    assert probes == [8, 17, 26]
    assert all(k == 0 for i, k in enumerate(trajectory) if i not in probes)
    # Now the draft is good: the probes raise alpha until some K beats plain decoding.
    cheap = ScriptedStep(1.0, draft_time_per_token=0.0005, target_time=0.0103)
    trajectory = drive(policy, [cheap] * 40)
    assert trajectory[-1] > 1


def test_learned_curve_without_a_measured_curve() -> None:
    # Only chunks of 5 seen: the prior slope (0.05 per token) fills in the rest.
    curve = LearnedCurve(smoothing=1.0, slope_prior=0.05)
    curve.observe(5, 0.012)
    assert curve.time(5) == pytest.approx(0.012)
    assert curve.time(1) == pytest.approx(0.012 / 1.2)
    # Two sizes: a straight line through them.
    curve.observe(1, 0.010)
    assert curve.time(3) == pytest.approx(0.011)
    assert curve.time(9) == pytest.approx(0.014)
    learned = curve.curve(9)
    assert learned is not None and learned.relative(4) == pytest.approx(1.2)


def test_learns_target_cost_from_records() -> None:
    policy = cost(None, prior_tokens=0.0)
    for _ in range(3):  # plain steps measure the one-token forward
        policy.observe(fake_record(0, 0, target_time=0.010))
    assert policy.target_one == pytest.approx(0.010)
    drive(policy, [ScriptedStep(0.75, draft_time_per_token=0.001, target_time=0.012)] * 6)
    assert policy.learned.time(5) == pytest.approx(0.012)
    assert policy.target_one == pytest.approx(0.010)
    assert policy.draft_cost == pytest.approx(0.1)
    assert 1 <= policy.plan().k <= 8


def test_state_is_reported() -> None:
    policy = cost(FLAT, prior_tokens=0.0)
    drive(policy, [0.75] * 4)
    state = policy.state()
    assert set(state) == {"k", "alpha", "draft_cost", "predicted_speedup"}
    assert state["alpha"] == pytest.approx(0.75)


def test_with_a_known_curve_the_warm_up_drafts_what_the_prior_predicts_pays() -> None:
    """Dear verification: the warm-up probes at K = 1 instead of paying for K = 4 drafts
    (the int4 demo lost 22% that way); flat or unknown: ``initial_k``."""
    assert CostK(cost_curve=STEEP).plan().k == 1
    assert CostK(cost_curve=FLAT).plan().k == 4
    assert CostK().plan().k == 4


# A prior that overprices verification (two tokens at 1.37x one, as one int4 bench measured
# on a busy machine) and the machine's truth (1.1x, then 0.1 more per token).
DEAR = CostCurve((1, 2, 3, 5, 9), (1.0, 1.37, 1.74, 2.48, 3.96))
TRUE = CostCurve((1, 2, 9), (0.020, 0.022, 0.036))


def one_in_three(step: int, k: int) -> ScriptedStep:
    """alpha 1/3 at K = 1, target times from ``TRUE``, drafting at 2.5% of a target step."""
    accepted = 1.0 if step % 3 == 0 else 0.0
    return ScriptedStep(accepted, draft_time_per_token=0.0005, target_time=TRUE.time(k + 1))


def test_the_steps_correct_a_prior_that_overprices_verification() -> None:
    # On the prior, K = 1 loses (S = 1.33 / 1.395); on the truth it wins (1.33 / 1.125).
    policy = cost(DEAR, prior_tokens=0.0)
    trajectory = drive(policy, one_in_three, 80)
    assert trajectory[:3] == [1, 1, 1]  # the warm-up: K = 1, where verification is dear
    assert trajectory[3] == 0  # only two-token steps seen: the prior's shape, K = 0
    # Plain steps measure one token, the next probe (after 32 plain tokens) two: the fit
    # now says 1.1x, and K = 1 stays.
    assert policy.learned.curve(9) is not None
    assert policy.learned.curve(9).relative(1) == pytest.approx(1.1)  # type: ignore[union-attr]
    assert trajectory[-10:] == [1] * 10
    assert policy.predicted == pytest.approx((4 / 3) / (0.025 + 1.1), rel=0.05)


def test_policies_sharing_a_calibration_open_from_what_it_learned() -> None:
    calibration = shared_calibration("cost", {"smoothing": 0.5}, DEAR)
    assert calibration is not None and calibration.smoothing == 0.5
    assert calibration.prior is DEAR
    assert shared_calibration("threshold", None, DEAR) is None
    first = make_policy("cost", {"checks": []}, cost_curve=DEAR, calibration=calibration)
    assert first.plan().k == 1  # the dear prior: warm up at K = 1
    # The first request sees a flat machine: every chunk size costs one token's time.
    drive(first, lambda step, k: ScriptedStep(1.0, target_time=0.02), 40)
    second = make_policy("cost", {"checks": []}, cost_curve=DEAR, calibration=calibration)
    assert isinstance(second, CostK) and second.learned is calibration
    assert second.plan().k == 4  # opens at initial_k: long drafts are cheap here
    alone = make_policy("cost", {"checks": []}, cost_curve=DEAR)
    assert alone.plan().k == 1  # without the shared calibration: the prior again
