"""Fallback at three depths: local back-off and probe, global cut-off, drafter failures."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from spectune.control import (
    CostK,
    GlobalFallback,
    GlobalFallbackConfig,
    Guarded,
    LocalFallback,
    LocalFallbackConfig,
    StepPlan,
    ThresholdK,
    make_policy,
)
from spectune.control.costs import CostCurve
from spectune.control.fallback import batch_limited
from spectune.control.replay import ScriptedStep, drive, fake_record
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import FailingDrafter, ScriptedDrafter
from spectune.models.llama import LlamaLM
from spectune.monitor import Monitor
from spectune.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=48)
PROMPT = [1, 30, 31, 32]  # the toy target decodes 64 tokens from it without EOS


def local_only(**options: object) -> Guarded:
    """Fixed K = 4 behind the local check only, so the trajectory is the check's alone."""
    policy = make_policy("fixed", {"k": 4, "checks": ["local"], "local": options})
    assert isinstance(policy, Guarded)
    return policy


# -- local --------------------------------------------------------------------------


@pytest.mark.parametrize("bad_steps", [5, 7, 10])
def test_local_triggers_after_exactly_n_bad_steps(bad_steps: int) -> None:
    policy = local_only(bad_steps=bad_steps)
    trajectory = drive(policy, [0.25] * (bad_steps - 1))
    assert trajectory == [4] * (bad_steps - 1)
    assert policy.plan() == StepPlan(4)
    drive(policy, [0.25])
    plan = policy.plan()
    assert plan.k == 0 and (plan.reason or "").startswith("local: acceptance below 50%")


def test_a_good_step_restarts_the_count() -> None:
    policy = local_only()
    assert drive(policy, [0.0] * 4 + [0.5] + [0.0] * 4) == [4] * 9
    assert policy.plan().k == 4
    drive(policy, [0.0])
    assert policy.plan().k == 0


def test_plain_steps_neither_count_nor_break_the_run() -> None:
    check = LocalFallback()
    for _ in range(3):
        check.observe(fake_record(4, 0))
    check.observe(fake_record(0, 0))
    check.observe(fake_record(4, 0, num_draft_tokens=0))  # the drafter had nothing to propose
    assert check.bad_run == 3
    check.observe(fake_record(4, 1))
    check.observe(fake_record(4, 0))
    assert check.check() is not None and check.check().max_k == 0  # type: ignore[union-attr]


def test_back_off_is_counted_in_tokens_then_probe_resumes_when_it_pays() -> None:
    policy = local_only(backoff_tokens=16, probe_steps=2)
    drive(policy, [0.0] * 5)
    # 16 plain steps of one token each, then two K = 1 probes; both accepted -> K = 4.
    trajectory = drive(policy, [1.0] * 24)
    assert trajectory == [0] * 16 + [1, 1] + [4] * 6


def test_a_failed_probe_backs_off_longer_each_time() -> None:
    policy = local_only(backoff_tokens=16, backoff_growth=2.0, probe_steps=1)
    trajectory = drive(policy, [0.0] * (5 + 16 + 1 + 32 + 1 + 64 + 1))
    assert trajectory == [4] * 5 + [0] * 16 + [1] + [0] * 32 + [1] + [0] * 64 + [1]
    assert "probe acceptance 0% below 50%" in (policy.plan().reason or "")


def test_back_off_counts_emitted_tokens_not_steps() -> None:
    check = LocalFallback(LocalFallbackConfig(backoff_tokens=10))
    for _ in range(5):
        check.observe(fake_record(4, 0))
    for _ in range(3):  # steps that emitted 3 tokens each (e.g. a probe of another check)
        check.observe(fake_record(2, 2))
    assert check.phase == "backoff" and check.backoff_left == 1
    check.observe(fake_record(0, 0))
    assert check.phase == "probe"


def test_max_back_off_caps_the_growth() -> None:
    config = LocalFallbackConfig(backoff_tokens=16, max_backoff_tokens=40, probe_steps=1)
    check = LocalFallback(config)
    for _ in range(5):
        check.observe(fake_record(4, 0))
    backoffs = []
    for _ in range(4):
        backoffs.append(check.backoff)
        while check.phase == "backoff":
            check.observe(fake_record(0, 0))
        check.observe(fake_record(1, 0))  # a failed probe
    assert backoffs == [16, 32, 40, 40]


# -- global -------------------------------------------------------------------------


def test_global_triggers_when_a_draft_step_costs_over_half_a_target_step() -> None:
    policy = make_policy("threshold", {"checks": ["global"]})
    slow = ScriptedStep(0.75, draft_time_per_token=0.006, target_time=0.010)
    trajectory = drive(policy, [slow] * 8)
    # The first step is not measured and four more make the warm-up: off from step 6.
    assert trajectory == [4] * 5 + [0] * 3
    assert (policy.plan().reason or "").startswith(
        "global: a draft step takes 60% of a target step (limit 50%)"
    )
    # For the rest of the request, even when drafting becomes cheap.
    fast = ScriptedStep(1.0, draft_time_per_token=0.0001, target_time=0.010)
    assert drive(policy, [fast] * 10) == [0] * 10


def test_global_stays_quiet_for_a_cheap_draft() -> None:
    policy = make_policy("threshold", {"checks": ["global"]})
    fast = ScriptedStep(0.75, draft_time_per_token=0.004, target_time=0.010)
    assert 0 not in drive(policy, [fast] * 50)


def test_global_is_smoothed_against_one_slow_step() -> None:
    check = GlobalFallback(GlobalFallbackConfig(warmup_steps=1))
    check.observe(fake_record(4, 2, draft_time=0.004, target_time=0.01))  # not measured
    for _ in range(10):
        check.observe(fake_record(4, 2, draft_time=0.004, target_time=0.01))
    check.observe(fake_record(4, 2, draft_time=0.040, target_time=0.01))  # one hiccup
    assert check.check() is None  # 0.8 * 0.1 + 0.2 * 1.0 = 0.28 of a target step


def test_global_uses_the_verification_curve_when_given() -> None:
    # Verifying 5 tokens costs 2x one token: the target step is half the pass.
    curve = CostCurve((1, 5), (0.005, 0.010))
    check = GlobalFallback(cost_curve=curve)
    for _ in range(6):
        check.observe(fake_record(4, 2, draft_time=4 * 0.003, target_time=0.010))
    assert check.ratio == pytest.approx(0.6)
    assert check.check() is not None


# -- the engine: a slow drafter, failing drafters -------------------------------------


def reference(target: LlamaLM, prompt: Sequence[int], params: SamplingParams) -> list[int]:
    return SpeculativeEngine(target).run(prompt, params).tokens


def oracle_drafter(
    prompt: Sequence[int], continuation: Sequence[int], vocab: int, *, right: bool, delay: float
) -> ScriptedDrafter:
    """Proposes the target's own greedy continuation (right) or a token off by one."""

    def script(context: Sequence[int], k: int) -> list[int]:
        start = len(context) - len(prompt)
        tokens = list(continuation[start : start + k])
        return tokens if right else [(t + 1) % vocab for t in tokens]

    return ScriptedDrafter(script, vocab_size=vocab, delay=delay)


class VirtualDelay:
    """Makes a drafter look slow without sleeping: each proposal moves the clock the engine
    reads (``time.perf_counter``) forward by ``seconds``. Deterministic on a busy machine,
    where a real sleep can be shorter than one descheduled target forward."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.offset = 0.0
        self.real = time.perf_counter

    def clock(self) -> float:
        return self.real() + self.offset

    def wrap(self, drafter: ScriptedDrafter) -> ScriptedDrafter:
        propose = drafter.propose

        def slow_propose(*args: Any, **kwargs: Any) -> Any:
            self.offset += self.seconds
            return propose(*args, **kwargs)

        drafter.propose = slow_propose  # type: ignore[method-assign]
        return drafter


def test_global_fallback_on_a_slow_drafter_in_the_engine(
    toy_target: LlamaLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = PROMPT
    expected = reference(toy_target, prompt, GREEDY)
    # A perfect drafter whose proposals take 100 virtual seconds: 12.5 s or more per
    # drafted token, against toy forwards that take milliseconds.
    delay = VirtualDelay(100.0)
    monkeypatch.setattr(time, "perf_counter", delay.clock)
    drafter = delay.wrap(oracle_drafter(prompt, expected, 64, right=True, delay=0.0))
    policy = make_policy("threshold", {"checks": ["global"]})
    steps = list(SpeculativeEngine(toy_target, drafter).generate(prompt, GREEDY, policy=policy))
    assert [t for s in steps for t in s.emitted] == expected
    assert all(s.draft_time >= 100.0 for s in steps if s.k > 0)
    assert [s.k > 0 for s in steps[:5]] == [True] * 5  # the unmeasured step, four of warm-up
    assert all(s.k == 0 for s in steps[5:])
    reasons = {s.fallback for s in steps[5:]}
    assert len(reasons) == 1 and next(iter(reasons), "").startswith("global: a draft step")


def test_slow_scripted_drafter_records_its_sleep(toy_target: LlamaLM) -> None:
    # The real ScriptedDrafter(delay=...) sleeps; only the lower bound of its draft time
    # is certain on a shared machine, so that is all this checks.
    prompt = PROMPT
    expected = reference(toy_target, prompt, SamplingParams(max_tokens=8))
    drafter = oracle_drafter(prompt, expected, 64, right=True, delay=0.01)
    engine = SpeculativeEngine(toy_target, drafter)
    steps = list(engine.generate(prompt, SamplingParams(max_tokens=8), policy=make_policy("fixed")))
    assert all(s.draft_time >= 0.01 for s in steps if s.k > 0)


def test_local_fallback_on_a_wrong_drafter_in_the_engine(toy_target: LlamaLM) -> None:
    prompt = PROMPT
    expected = reference(toy_target, prompt, GREEDY)
    drafter = oracle_drafter(prompt, expected, 64, right=False, delay=0.0)
    policy = make_policy("threshold", {"checks": ["local"]})
    steps = list(SpeculativeEngine(toy_target, drafter).generate(prompt, GREEDY, policy=policy))
    assert [t for s in steps for t in s.emitted] == expected
    assert [s.k for s in steps[:5]] == [4] * 5
    assert [s.k for s in steps[5:21]] == [0] * 16
    assert all((s.fallback or "").startswith("local:") for s in steps[5:21])
    assert [s.k for s in steps[21:23]] == [1, 1]  # the probe, which fails
    assert all(s.k == 0 for s in steps[23:])


@pytest.mark.parametrize("mode", ["raise", "nan", "oov"])
@pytest.mark.parametrize("policy_name", ["threshold", "cost", "fixed"])
def test_failing_drafter_falls_back_to_exact_plain_output(
    toy_target: LlamaLM, mode: str, policy_name: str
) -> None:
    prompt = [1, 7, 3, 22, 8]
    expected = reference(toy_target, prompt, GREEDY)
    drafter = FailingDrafter(mode, vocab_size=64, after=2)
    policy = make_policy(policy_name, params=GREEDY)
    monitor = Monitor()
    watch = monitor.request(policy=policy)
    engine = SpeculativeEngine(toy_target, drafter)
    steps = list(watch.watch(engine.generate(prompt, GREEDY, policy=policy)))
    assert [t for s in steps for t in s.emitted] == expected
    failed = [i for i, s in enumerate(steps) if (s.fallback or "").startswith("drafter_error")]
    assert failed and failed == list(range(failed[0], len(steps)))
    assert all(s.k == 0 for s in steps[failed[0] + 1 :])
    snap = watch.snapshot()
    assert snap.fallback_events["drafter_error"] == 1
    assert snap.fallback_steps["drafter_error"] == len(failed)


# -- composition ----------------------------------------------------------------------


def test_guarded_reports_the_holding_reason_and_everyones_state() -> None:
    policy = make_policy("threshold")
    assert isinstance(policy, Guarded) and isinstance(policy.inner, ThresholdK)
    state = policy.state()
    assert state["policy"] == "threshold" and state["next_k"] == 4 and state["hold"] is None
    assert {"local.phase", "global.tripped", "window_acceptance"} <= set(state)
    drive(policy, [0.0] * 5)
    state = policy.state()
    assert state["next_k"] == 0 and state["local.phase"] == "backoff"
    assert state["hold"] == policy.plan().reason


def test_wrappers_forward_the_whole_plan_groups_included() -> None:
    """``Guarded`` and the batch-size gate hand on the inner policy's ``StepPlan`` whole: K,
    the cost policy's verification groups and its reason. An objection caps K, cuts the
    group table to the new K and, when it holds K at 0, gives its own reason."""
    linear = CostCurve((1, 2, 4, 8, 16), (1.0, 2.0, 4.0, 8.0, 16.0))  # compute bound
    cost = CostK(cost_curve=linear)
    # A weak draft (alpha 0.5), target times on the curve.
    drive(cost, lambda i, k: ScriptedStep(0.25, target_time=linear.time(k + 1)), 6)
    off = cost.plan()  # no K beats plain decoding on this curve: K 0, with the reason
    assert off.k == 0 and (off.reason or "").startswith("cost: no K beats plain")
    assert Guarded(cost, [LocalFallback()], name="cost").plan() == off
    cost.k = 4  # held at 4 by hand: the groups it would verify drafts of 0-4 tokens in
    plan = cost.plan()
    assert plan.verify_groups is not None and max(plan.verify_groups) > 1
    wrapped = [
        Guarded(cost, [LocalFallback(), GlobalFallback()], name="cost"),
        batch_limited(cost, lambda: 2, 4),
        batch_limited(Guarded(cost, [GlobalFallback()], name="cost"), lambda: 1, 1),
    ]
    assert [policy.plan() for policy in wrapped] == [plan] * 3
    # Over the batch limit: K 0 and the gate's reason; the group table cut to match.
    assert batch_limited(cost, lambda: 5, 4).plan() == StepPlan(0, (1,), "batch_too_large: 5 > 4")
    # A probe caps K at 1 without a reason of its own: the inner policy's stands.
    local = LocalFallback(LocalFallbackConfig(bad_steps=1, backoff_tokens=1))
    probing = Guarded(cost, [local], name="cost")
    drive(probing, [0.0, 0.0])  # one bad step, then a one-token back-off
    cost.k = 4  # the cost model, observing too, dropped K to 0 again
    assert local.phase == "probe" and cost.plan().reason is None
    assert probing.plan() == StepPlan(1, (1, 1), None)


def test_fixed_has_no_checks_unless_asked() -> None:
    assert drive(make_policy("fixed", {"k": 3}), [0.0] * 30) == [3] * 30
    guarded = make_policy("fixed", {"k": 3, "checks": ["local"]})
    assert 0 in drive(guarded, [0.0] * 30)


def test_when_both_checks_hold_the_permanent_reason_is_recorded() -> None:
    policy = make_policy("threshold")
    useless = ScriptedStep(0.0, draft_time_per_token=0.01, target_time=0.01)
    trajectory = drive(policy, [useless] * 10)
    assert trajectory == [4] * 5 + [0] * 5
    assert (policy.plan().reason or "").startswith("global:")
