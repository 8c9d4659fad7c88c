"""The cost policy: K from measured alpha, draft cost and the verification curve."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest

from spectune.control import CostK, make_policy
from spectune.control.cost import LearnedCurve
from spectune.control.costs import CostCurve, optimal_k
from spectune.control.registry import shared_calibration
from spectune.control.replay import ScriptedStep, drive, fake_record
from spectune.errors import InvalidParameterError

# A GPU-like curve: verifying k tokens costs little more than one.
FLAT = CostCurve((1, 2, 4, 8, 16), (0.010, 0.0101, 0.0103, 0.0108, 0.012))
# A compute-bound curve: a forward's time grows with its tokens.
STEEP = CostCurve((1, 2, 4, 8, 16), (0.010, 0.018, 0.034, 0.066, 0.130))


def cost(curve: CostCurve | None = None, **options: object) -> CostK:
    policy = make_policy("cost", {"checks": [], **options}, cost_curve=curve)
    assert isinstance(policy, CostK)
    return policy


def iid(
    alpha: float, curve: CostCurve, draft_time_per_token: float = 0.001, seed: int = 0
) -> Callable[[int, int], ScriptedStep]:
    """A script in which each draft token is kept with probability ``alpha`` given the
    ones before it (i.i.d. acceptance, a seeded draw), target times on ``curve``."""
    rng = random.Random(seed)

    def step(index: int, k: int) -> ScriptedStep:
        kept = 0
        while kept < k and rng.random() < alpha:
            kept += 1
        return ScriptedStep(
            kept / k if k else 0.0, draft_time_per_token, target_time=curve.time(k + 1)
        )

    return step


def test_all_accepted_with_a_cheap_draft_goes_to_max_k() -> None:
    step = ScriptedStep(1.0, draft_time_per_token=0.0005, target_time=0.0105)
    trajectory = drive(cost(FLAT), [step] * 10)
    assert trajectory[:3] == [4, 4, 4]  # warm-up at the initial K
    assert trajectory[-1] == 8


def test_a_steep_curve_keeps_k_small() -> None:
    # alpha = 0.6 (i.i.d.), drafting at 1% of a target step: on a flat curve K = 5 pays
    # best (1.9x), on this compute-bound one nothing does (K = 1: 0.88x).
    assert optimal_k(0.6, 0.01, STEEP)[0] == 0 and optimal_k(0.6, 0.01, FLAT)[0] == 5
    for seed in range(3):
        policy = cost(STEEP, initial_k=4, max_verify_groups=1)  # one pass per step
        trajectory = drive(policy, iid(0.6, STEEP, draft_time_per_token=0.0001, seed=seed), 60)
        assert policy.alpha is not None and 0.35 < policy.alpha < 0.85
        assert max(trajectory[3:]) <= 1  # plain, but for K = 1 probes every 32 tokens
        assert trajectory[-1] == 0
        flat = drive(cost(FLAT), iid(0.6, FLAT, draft_time_per_token=0.0001, seed=seed), 60)
        assert min(flat[10:]) >= 3


def test_decision_matches_the_speedup_model() -> None:
    policy = cost(FLAT, margin=0.0, deepen_every=1000)
    drive(policy, iid(0.6, FLAT), 40)
    assert policy.draft_cost == pytest.approx(0.1)  # 1 ms per token over 10 ms
    c = policy.draft_cost
    speedups = {
        k: (1 + policy.expected_accepted(k)) / (k * c + FLAT.relative(k)) for k in range(1, 9)
    }
    speedups[0] = 1.0
    best_k = max(speedups, key=lambda k: (speedups[k], -k))
    assert policy.plan().k == best_k
    assert policy.predicted == pytest.approx(speedups[best_k])


def test_without_later_positions_measured_the_model_is_iid() -> None:
    """Before any step, every position's rate is the prior alpha: E(K) and S(K) are the
    i.i.d. formulas (``predicted_speedup``)."""
    policy = cost(FLAT, prior_alpha=0.4)
    assert policy.position_rates(3) == pytest.approx([0.4, 0.4, 0.4])
    assert policy.expected_accepted(3) == pytest.approx(0.4 + 0.16 + 0.064)
    # One step keeps its first token and rejects the second: r_1 rises, r_2 falls, and
    # r_3 (never reached) follows r_2.
    drive(policy, [ScriptedStep(0.25)])  # K = 4: one of four kept
    rates = policy.position_rates(3)
    assert rates[0] > 0.4 and rates[1] < rates[0]
    assert rates[2] == pytest.approx(policy.alpha)  # never reached: alpha


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
    policy = cost(None, prior_tokens=0.0, max_k=4)
    for _ in range(3):  # plain steps measure the one-token forward
        policy.observe(fake_record(0, 0, target_time=0.010))
    assert policy.target_one == pytest.approx(0.010)
    # Every draft token kept, K held at its maximum, 4: chunks of 5 tokens only.
    drive(policy, [ScriptedStep(1.0, draft_time_per_token=0.001, target_time=0.012)] * 6)
    assert policy.learned.time(5) == pytest.approx(0.012)
    assert policy.target_one == pytest.approx(0.010)
    assert policy.draft_cost == pytest.approx(0.1)
    assert policy.plan().k == 4


def test_state_is_reported() -> None:
    policy = cost(FLAT, prior_tokens=0.0)
    drive(policy, [0.75] * 3)  # the warm-up: three of four kept each step
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
    # (No K + 1 steps: this script keeps every token of every third step at any K.)
    policy = cost(DEAR, prior_tokens=0.0, deepen_every=1000)
    trajectory = drive(policy, one_in_three, 80)
    assert trajectory[:3] == [1, 1, 1]  # the warm-up: K = 1, where verification is dear
    assert trajectory[3] == 0  # only two-token steps seen: the prior's shape, K = 0
    # One plain step measures one token: with the two-token steps the fit says 1.1x, and
    # K = 1 is back at once (not 32 plain tokens later, at the next probe) and stays.
    assert policy.learned.curve(9) is not None
    assert policy.learned.curve(9).relative(1) == pytest.approx(1.1)  # type: ignore[union-attr]
    assert trajectory[4:] == [1] * 76
    assert policy.predicted == pytest.approx((4 / 3) / (0.025 + 1.1), rel=0.05)


def test_two_nearby_sizes_do_not_extrapolate_their_noise_to_one_token() -> None:
    """Three- and two-token steps at 20 and 18 ms on a prior that prices them 1.23x and
    1.19x one token (int4 on an AMD EPYC, whose plain steps took 15 ms): a line through the
    two alone put one token at 8.5 ms and priced every K under plain decoding; the prior's
    own one-token time keeps it near the truth."""
    prior = CostCurve((1, 2, 3, 9), (1.0, 1.19, 1.23, 2.2))
    curve = LearnedCurve(smoothing=1.0, slope_prior=0.05, prior=prior)
    curve.observe(3, 0.020)
    curve.observe(2, 0.018)
    one = curve.time(1)
    assert one is not None and 0.014 < one < 0.017
    curve.observe(1, 0.015)  # once a one-token step is seen, the line goes through it
    assert curve.time(1) == pytest.approx(0.015, rel=0.05)


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


# Verification at int4-like prices: two tokens cost 1.1x one, three 1.31x.
PRICEY = CostCurve((1, 2, 3, 5, 9), (0.020, 0.022, 0.02622, 0.034, 0.050))


def runs_of_two(step: int, k: int) -> ScriptedStep:
    """A suffix-like drafter: every third step its first token is kept and then so is its
    second (r_1 = 1/3, r_2 = 1); target times on ``PRICEY``, drafting at 2.5%."""
    kept = min(k, 2) if step % 3 == 0 else 0
    return ScriptedStep(kept / k if k else 0.0, 0.0005, target_time=PRICEY.time(k + 1))


def test_correlated_acceptance_keeps_the_k_that_pays() -> None:
    # Truth: K = 1 gives 1.33 / 1.125 = 1.19x, K = 2 gives 1.67 / 1.36 = 1.22x. The
    # i.i.d. model, fed the same steps' alpha (0.42 at K = 2), says K = 1 pays more.
    policy = cost(None, initial_k=2, max_verify_groups=1)
    trajectory = drive(policy, runs_of_two, 60)
    assert policy.alpha is not None and policy.draft_cost is not None
    assert optimal_k(policy.alpha, policy.draft_cost, PRICEY)[0] == 1
    rates = policy.position_rates(2)
    assert rates[0] == pytest.approx(1 / 3, abs=0.1) and rates[1] > 0.9
    assert trajectory[5:].count(2) >= 50  # K = 2 throughout, but one K + 1 step


def test_every_deepen_every_steps_one_step_drafts_one_more() -> None:
    policy = cost(FLAT, initial_k=2, max_k=4, deepen_every=5, margin=1.0)  # K held at 2
    trajectory = drive(policy, [ScriptedStep(0.5)] * 20)
    assert trajectory == [2] * 5 + [3] + [2] * 5 + [3] + [2] * 5 + [3] + [2, 2]
    at_max = cost(FLAT, initial_k=4, max_k=4, deepen_every=5, margin=1.0)
    assert drive(at_max, [ScriptedStep(0.5)] * 12) == [4] * 12  # no K + 1 past max_k


def test_checked_guesses_on_plain_steps_bring_k_back_before_a_probe() -> None:
    """While K = 0 a model-free drafter's guesses are checked on plain steps
    (StepPlan.shadow): when they start matching, K comes back long before the next probe."""
    policy = cost(FLAT, prior_tokens=0.0, probe_every=32)
    drive(policy, [ScriptedStep(0.0, draft_time_per_token=5e-5)] * 3)  # a lookup's cost
    assert policy.plan().k == 0 and policy.plan().shadow
    hits = 0
    while policy.plan().k == 0 and hits < 8:
        policy.observe(dataclasses.replace(fake_record(0, 0, draft_time=5e-5), shadow_hit=True))
        hits += 1
    assert policy.plan().k > 0 and hits < 8  # a probe would have come after 32
    # misses count against the draft the same way
    for _ in range(20):
        policy.observe(dataclasses.replace(fake_record(0, 0), shadow_hit=False))
    assert policy.alpha is not None and policy.alpha < 0.05
    assert not cost(FLAT, shadow=False).plan().shadow


def test_guesses_are_asked_as_often_as_their_cost_fits_the_shadow_budget() -> None:
    """Each guess costs the drafter a draft step: at K = 0 a guess costing s of a target
    step is asked every ceil(s / shadow_budget) plain steps (a lookup's ~0.005 and a head's
    ~0.07 every step at the default 0.1, a draft LM's 0.3 every third), and its time is
    not a draft-cost sample (a one-token call carries the drafter's fixed cost)."""
    for seconds, every in ((5e-5, 1), (7e-4, 1), (3e-3, 3)):  # s on FLAT: x 100
        policy = cost(FLAT, prior_tokens=0.0, probe_every=1000)
        drive(policy, [ScriptedStep(0.0, draft_time_per_token=seconds)] * 3)
        per_token = policy.draft_token_time
        asked = []
        for _ in range(3 * every):
            plan = policy.plan()
            assert plan.k == 0
            asked.append(plan.shadow)
            spent = seconds if plan.shadow else 0.0
            record = fake_record(0, 0, draft_time=spent, target_time=0.010)
            policy.observe(dataclasses.replace(record, shadow_hit=False if spent else None))
        times = [i for i, shadow in enumerate(asked) if shadow]
        assert times[0] < every and len(times) == 3, (seconds, asked)
        assert {b - a for a, b in zip(times, times[1:], strict=False)} == {every}
        assert policy.draft_token_time == per_token  # guesses leave c as measured
    # a guess that turns out dearer than the drafted tokens spaces the next ones out
    policy = cost(FLAT, prior_tokens=0.0, probe_every=1000)
    drive(policy, [ScriptedStep(0.0, draft_time_per_token=5e-5)] * 3)
    policy.observe(dataclasses.replace(fake_record(0, 0, draft_time=5e-3), shadow_hit=False))
    assert not policy.plan().shadow
    with pytest.raises(InvalidParameterError):
        cost(FLAT, shadow_budget=0.0)
