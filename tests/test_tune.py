"""``spectune tune``: the replay, the search, the policy file and the command.

Workloads are scripted (per-token outcomes recorded at a fixed K, timings injected), so the
best policy is known from arithmetic; no test times anything.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from spectune.cli import build_parser, main
from spectune.cli.policy_args import policy_spec_from_args
from spectune.control.config import PolicySpec, load_policy_file
from spectune.control.costs import CostCurve
from spectune.control.registry import build_policy
from spectune.control.replay import fake_record
from spectune.control.tune import (
    MIN_GAIN,
    params_spec,
    policy_toml,
    predict,
    search,
    seed_params,
)
from spectune.control.workload import RecordedRequest, StepCosts, fit_costs, fit_workload
from spectune.errors import InvalidParameterError
from spectune.models.loading import save_native
from spectune.models.toy import perturbed, toy_model
from spectune.server.testing import toy_tokenizer


def recorded(
    outcomes: Sequence[bool],
    *,
    k: int = 8,
    draft_per_token: float = 0.0005,
    target_one: float = 0.02,
    target_slope: float = 0.0005,
    temperature: float = 0.0,
) -> RecordedRequest:
    """What a fixed-K run over tokens with these outcomes records (as the engine would)."""
    steps = []
    position = 0
    while position < len(outcomes):
        drafted = min(k, len(outcomes) - position - 1)
        accepted = 0
        while accepted < drafted and outcomes[position + accepted]:
            accepted += 1
        emitted = min(accepted + 1, len(outcomes) - position)
        steps.append(
            fake_record(
                drafted,
                accepted,
                draft_time=draft_per_token * drafted,
                target_time=target_one + target_slope * drafted,
                overhead_time=0.001,
                emitted=emitted,
                index=len(steps),
            )
        )
        position += emitted
    return RecordedRequest(temperature, tuple(steps))


def bernoulli(alpha: float, requests: int = 6, tokens: int = 96) -> list[RecordedRequest]:
    rng = random.Random(7)
    return [recorded([rng.random() < alpha for _ in range(tokens)]) for _ in range(requests)]


def test_replay_of_known_outcomes_is_exact() -> None:
    """Outcomes accept, accept, reject, repeated, all known but the last token's (no step
    drafts the last token): K = 1 takes 2 steps per 3 tokens (accept + bonus, then a
    rejection) and drafts nothing at the last token; K = 2 takes 1 step per 3 tokens."""
    request = recorded([True, True, False] * 10)
    workload = fit_workload([request])
    assert workload.known_fraction == 29 / 30
    costs = fit_costs([request])
    one = predict(workload, costs, PolicySpec("fixed", {"k": 1}))
    two = predict(workload, costs, PolicySpec("fixed", {"k": 2}))
    assert (one.tokens, one.steps, one.accepted, one.drafted) == (30, 20, 10, 19)
    assert (two.tokens, two.steps, two.accepted, two.drafted) == (30, 10, 20, 20)


def test_costs_are_fitted_from_the_recorded_times() -> None:
    costs = fit_costs(bernoulli(0.5))
    assert costs.source == "trace"
    assert costs.draft_per_token == pytest.approx(0.0005)
    assert costs.verify.time(1) == pytest.approx(0.02)
    assert costs.verify.time(5) == pytest.approx(0.022)
    assert costs.overhead_speculative == pytest.approx(0.001)


def test_search_drops_the_pause_where_k1_pays() -> None:
    """The issue's case: about 30% acceptance with a free draft and a flat verification
    curve pays at small K, but the seed's local check pauses it (under 50% for 5 steps)."""
    workload = fit_workload(bernoulli(0.3))
    costs = fit_costs(bernoulli(0.3))
    result = search(workload, costs)
    best = result.best
    assert result.predicted.tokens_per_second > 1.05 * result.seed.tokens_per_second
    assert result.predicted.tokens_per_second > result.plain.tokens_per_second
    best_fixed = result.fixed[result.best_fixed_k].tokens_per_second
    assert result.predicted.tokens_per_second >= best_fixed * (1 - MIN_GAIN)
    assert "local" not in best["checks"] or best["local.below"] <= 0.3
    assert best["max_k"] <= 3


def test_search_takes_the_longest_drafts_when_every_token_is_accepted() -> None:
    requests = [recorded([True] * 96) for _ in range(4)]
    result = search(fit_workload(requests), fit_costs(requests))
    assert result.best["max_k"] == 8 and result.best_fixed_k == 8
    assert result.predicted.tokens_per_second >= result.fixed[8].tokens_per_second * 0.98
    assert result.predicted.tokens_per_second > result.seed.tokens_per_second


def test_search_keeps_the_seed_where_nothing_beats_it() -> None:
    """With every token rejected and no draft cost, all policies tie near plain decoding:
    nothing may move (a change must win by MIN_GAIN)."""
    requests = [recorded([False] * 64, draft_per_token=0.0) for _ in range(2)]
    costs = StepCosts(CostCurve((1, 2), (0.02, 0.02)), 0.0, 0.0, 0.0, 0.0, "measured")
    result = search(fit_workload(requests), costs)
    assert dict(result.best) == seed_params()


def test_the_temperature_rule_applies_to_sampled_requests() -> None:
    """K - 1 above ``hot_temperature``: on drafts that are always right it costs speed."""
    requests = [recorded([True] * 64, temperature=0.7) for _ in range(2)]
    workload, costs = fit_workload(requests), fit_costs(requests)
    hot = predict(workload, costs, params_spec({**seed_params(), "hot_temperature": 0.3}))
    off = predict(workload, costs, params_spec({**seed_params(), "hot_temperature": 100.0}))
    assert hot.drafted < off.drafted and hot.tokens_per_second < off.tokens_per_second


def test_a_trace_without_draft_steps_is_refused() -> None:
    plain = RecordedRequest(0.0, (fake_record(0, 0),))
    with pytest.raises(InvalidParameterError, match="no chain draft steps"):
        fit_workload([plain])


def test_policy_toml_round_trips_into_policy_file(tmp_path: Path) -> None:
    params = {**seed_params(), "initial_k": 2, "checks": ("global",), "local.below": 0.2}
    spec = params_spec(params)
    path = tmp_path / "tuned.toml"
    path.write_text(policy_toml(spec, ["a comment"]))
    loaded = load_policy_file(path)
    assert loaded == spec
    policy = build_policy(loaded)
    assert policy.plan().k == 2
    for command in (["generate", "hi"], ["serve"]):  # the commands that take --policy-file
        args = build_parser().parse_args([*command, "--policy-file", str(path)])
        assert policy_spec_from_args(args) == spec


@pytest.fixture(scope="module")
def toy_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tune") / "toy"
    save_native(toy_model(0, scale=3.0), folder)
    toy_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def toy_draft_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft model that always drafts (an n-gram drafter may find no match in a short
    toy output) and agrees with the toy target often but not always."""
    folder = tmp_path_factory.mktemp("tune") / "draft"
    save_native(perturbed(toy_model(0, scale=3.0), 0.3), folder)
    toy_tokenizer(folder)
    return folder


def test_tune_from_a_trace_end_to_end(toy_folder: Path, tmp_path: Path) -> None:
    trace, out = tmp_path / "run.jsonl", tmp_path / "tuned.toml"
    base = ["--target", str(toy_folder), "--draft", "ngram", "--max-tokens", "24"]
    assert main(["generate", "w1 w2 w3 w1 w2", *base, "--trace", str(trace)]) == 0
    assert main(["tune", "--trace", str(trace), "--out", str(out)]) == 0
    spec = load_policy_file(out)
    assert spec.name == "threshold"
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["source"] == "traces" and report["confirm"] is None
    assert {p["option"] for p in report["parameters"]} == set(seed_params())
    assert "Chosen values against the seed's rules" in out.with_suffix(".md").read_text()
    # The tuned file drives generate (and bench reads it the same way, see below).
    assert main(["generate", "w1 w2", *base, "--policy-file", str(out)]) == 0


@pytest.mark.slow  # loads two toy models and decodes: ~1 min on an idle 2-core machine
def test_tune_on_a_prompt_set_confirms_on_held_out_prompts(
    toy_folder: Path, toy_draft_folder: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"category": "a", "split": "dev", "prompt": "w1 w2 w3 w1 w2 w3"},
        {"category": "a", "split": "test", "prompt": "w2 w3 w1 w2"},
        {"category": "b", "split": "dev", "prompt": "w3 w3 w1"},
    ]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "tuned.toml"
    argv = ["tune", "--target", str(toy_folder), "--draft", str(toy_draft_folder)]
    argv += ["--prompts", str(prompts), "--max-tokens", "10", "--confirm-prompts", "1"]
    assert main([*argv, "--out", str(out), "--record-trace", str(tmp_path / "dev.jsonl")]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["source"] == "prompts" and report["dev_prompts"] == ["a-1", "b-3"]
    confirm = report["confirm"]
    assert confirm["prompts"] == ["a-2"]
    assert set(confirm["measured"]) == {"plain", "seed", "best fixed K", "tuned"}
    assert confirm["greedy_identical_to_plain"] is True  # lossless, whatever the policy
    assert (tmp_path / "dev.jsonl").stat().st_size > 0


def test_bench_runs_a_policy_file(toy_folder: Path, tmp_path: Path) -> None:
    from spectune.bench.assemble import DraftSource, build_systems
    from spectune.cli.bench import config_from_args
    from spectune.drafters.ngram import NgramDrafter

    path = tmp_path / "mine.toml"
    path.write_text(policy_toml(params_spec(seed_params())))
    argv = ["bench", "--target", str(toy_folder), "--draft", "ngram", "--policy-file", str(path)]
    config = config_from_args(build_parser().parse_args(argv))
    assert config.policy_files == (str(path),)
    target = toy_model(0)
    systems = build_systems(config, target, None, [DraftSource("ngram", NgramDrafter())], [])
    assert "spectune ngram mine" in [s.info.name for s in systems]


def test_a_pause_must_pay_clearly_unless_it_is_the_protection() -> None:
    """Fallback checks after the search: one that fires but pays under CHECK_GAIN goes, also
    where drafting pays only a little without it; one that pays more stays; one that never
    fires stays (a safety net); and where drafting without the pause is slower than plain
    decoding, the pause stays (it is the protection)."""
    from spectune.control.tune import CHECK_GAIN, _robust_checks

    both = {**seed_params(), "checks": ("global", "local")}

    def rates(with_local: float, without_local: float) -> Callable[[Mapping[str, Any]], float]:
        # "global" never fires: the same prediction with or without it.
        return lambda p: with_local if "local" in p["checks"] else without_local

    small = 1.0 + CHECK_GAIN / 2
    assert _robust_checks(both, rates(20.0 * small, 20.0), 15.0)["checks"] == ("global",)
    large = 1.0 + 2 * CHECK_GAIN
    assert _robust_checks(both, rates(20.0 * large, 20.0), 15.0)["checks"] == ("global", "local")
    # Drafting pays 1% without the pause, the pause adds under CHECK_GAIN: it goes.
    assert _robust_checks(both, rates(15.15 * small, 15.15), 15.0)["checks"] == ("global",)
    # Without the pause drafting is slower than plain decoding: it stays.
    assert _robust_checks(both, rates(15.0 * small, 14.9), 15.0)["checks"] == ("global", "local")
