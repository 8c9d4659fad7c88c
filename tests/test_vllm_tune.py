"""``tune --engine vllm`` without a server: the grid, the schedule builder (K = 0 ranges,
the noise rule, never slower than off), the cost fit, the prompt allotment, the report
and plot, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.cli.tune_vllm_report import markdown, plot, tables
from spectune.engines.costs import load_costs, save_costs
from spectune.engines.vllm.tune import SCHEDULE, Batch, TunePlan, VllmTuneResult, allot
from spectune.engines.vllm.tune_grid import QUICK, Grid, candidates
from spectune.engines.vllm.tune_schedule import (
    MAX_BATCH,
    CostPoint,
    Ratio,
    beats_off,
    build_schedule,
    fit_costs,
    guard,
    pick_k,
    ratio,
    schedule_ranges,
    slower_than_off,
)
from spectune.prompts import load_prompts


def vllm_accepts(ranges: list[tuple[int, int, int]]) -> None:
    """vLLM 0.32's own rules (``validate_and_normalize_dynamic_sd_schedule``)."""
    assert ranges and ranges[0][0] == 1
    previous_end = 0
    for start, end, k in ranges:
        assert 0 < start <= end and k >= 0
        assert start > previous_end  # sorted, not overlapping
        previous_end = end


def sure(mean: float) -> Ratio:
    return Ratio(mean, 0.01, 3)


# --- the noise rule ------------------------------------------------------------------


def test_ratio_is_the_mean_of_per_round_ratios_with_its_standard_error() -> None:
    r = ratio([12.0, 11.0, 13.0], [10.0, 10.0, 10.0])
    assert r.mean == pytest.approx(1.2)
    assert r.se == pytest.approx(0.1 / 3**0.5)
    assert ratio([12.0], [10.0]).se is None
    with pytest.raises(ValueError):
        ratio([1.0, 2.0], [1.0])


def test_a_gain_counts_only_beyond_the_noise() -> None:
    assert beats_off(Ratio(1.10, 0.02, 3), z=2)
    assert not beats_off(Ratio(1.10, 0.06, 3), z=2)  # 1.10 - 0.12 < 1
    assert beats_off(Ratio(1.10, 0.06, 3), z=1)
    assert not beats_off(Ratio(1.5, None, 1), z=2)  # one round: no noise estimate
    assert beats_off(Ratio(1.5, None, 1), z=0)
    assert slower_than_off(Ratio(0.90, 0.02, 3), z=2)
    assert not slower_than_off(Ratio(0.98, 0.02, 3), z=2)  # within the noise
    assert slower_than_off(Ratio(0.98, None, 1), z=2)  # one round: any loss


def test_pick_k_takes_the_best_beyond_noise_else_zero() -> None:
    assert pick_k({2: sure(1.2), 4: sure(1.3)}, z=2) == 4
    assert pick_k({2: sure(1.2), 4: Ratio(1.3, 0.2, 3)}, z=2) == 2  # 4 is within noise
    assert pick_k({2: sure(0.95), 4: sure(1.0)}, z=2) == 0
    assert pick_k({2: sure(1.2), 4: sure(1.2)}, z=2) == 2  # a tie: the cheaper K


# --- the schedule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k_at", "expected"),
    [
        # each level its K; between 2 and 4 the smaller; above 8 (not measured) 0
        ({1: 4, 2: 4, 4: 2, 8: 0}, [(1, 2, 4), (3, 4, 2), (5, MAX_BATCH, 0)]),
        # off in the middle: the sizes next to it are off too
        ({1: 3, 2: 0, 4: 3}, [(1, 1, 3), (2, 3, 0), (4, 4, 3), (5, MAX_BATCH, 0)]),
        # all K = 0 is still a valid vLLM schedule
        ({1: 0, 2: 0}, [(1, MAX_BATCH, 0)]),
        # no level 1: batch size 1 was not measured, so 0
        ({2: 3, 4: 3}, [(1, 1, 0), (2, 4, 3), (5, MAX_BATCH, 0)]),
        ({1: 2}, [(1, 1, 2), (2, MAX_BATCH, 0)]),
    ],
)
def test_schedule_ranges(k_at: dict[int, int], expected: list[tuple[int, int, int]]) -> None:
    ranges = schedule_ranges(k_at)
    assert ranges == expected
    vllm_accepts(ranges)


def test_schedule_ranges_refuses_bad_levels() -> None:
    for bad in ({}, {0: 2}, {MAX_BATCH: 2}, {1: -1}):
        with pytest.raises(ValueError):
            schedule_ranges(bad)


def test_build_schedule_gives_zero_where_no_k_beats_off() -> None:
    by_level = {
        1: {2: sure(1.3), 4: sure(1.4)},
        2: {2: sure(1.1), 4: sure(1.05)},
        4: {2: Ratio(1.02, 0.03, 3), 4: sure(0.9)},  # within the noise / slower
        8: {2: sure(0.8), 4: sure(0.7)},
    }
    k_at, ranges = build_schedule(by_level, z=2)
    assert k_at == {1: 4, 2: 2, 4: 0, 8: 0}
    assert ranges == [(1, 1, 4), (2, 2, 2), (3, MAX_BATCH, 0)]
    vllm_accepts(ranges)


def test_guard_keeps_only_confirmed_gains() -> None:
    k_at = {1: 4, 2: 4, 4: 2}
    confirmed = {1: sure(1.3), 2: Ratio(1.05, 0.04, 3), 4: sure(1.1)}
    kept = guard(k_at, confirmed, z=2)
    assert kept.k_at == {1: 4, 2: 0, 4: 2}
    assert kept.dropped == (2,)
    assert kept.ranges == [(1, 1, 4), (2, 3, 0), (4, 4, 2), (5, MAX_BATCH, 0)]
    assert kept.reason is None


def test_guard_never_recommends_a_schedule_slower_than_off() -> None:
    # Slower than off where it drafted: that level goes to 0.
    kept = guard({1: 3, 2: 3}, {1: sure(1.2), 2: sure(0.8)}, z=2)
    assert kept.k_at == {1: 3, 2: 0} and kept.ranges == [(1, 1, 3), (2, MAX_BATCH, 0)]
    # Slower than off where it drafted nothing: the speculative path costs, stay off.
    kept = guard({1: 3, 2: 0}, {1: sure(1.2), 2: sure(0.8)}, z=2)
    assert kept.ranges is None and kept.k_at == {1: 0, 2: 0}
    assert kept.reason is not None and "concurrency 2" in kept.reason
    # Nothing beyond the noise anywhere: off.
    kept = guard({1: 3}, {1: Ratio(1.1, 0.1, 3)}, z=2)
    assert kept.ranges is None and kept.reason == "no level gained beyond the noise"


# --- the grid --------------------------------------------------------------------------


def test_default_grid_is_off_first_and_marks_vllm_defaults() -> None:
    found = candidates(Grid())
    assert found[0].name == "off" and found[0].config is None
    names = [c.name for c in found]
    assert len(names) == len(set(names))
    suffix = [c for c in found if c.config and c.config["method"] == "suffix" and not c.builtin]
    assert {c.config["suffix_decoding_max_cached_requests"] for c in suffix if c.config} == {
        0,
        10000,
    }
    builtins = [c for c in found if c.builtin]
    assert [c.config for c in builtins] == [
        {"method": "ngram", "num_speculative_tokens": 4},
        {"method": "suffix"},
    ]


def test_a_grid_member_at_vllm_defaults_is_measured_once() -> None:
    found = candidates(Grid(ngram_lookup=((5, 5),), k=(4,), methods=("ngram",)))
    ngram = [c for c in found if c.config and c.config["method"] == "ngram"]
    assert len(ngram) == 1 and ngram[0].builtin


def test_quick_grid_and_heads() -> None:
    assert [c.name for c in candidates(QUICK)] == [
        "off",
        "ngram lookup 2-4 K=3",
        "suffix depth 24 p>=0.1 cache on K=3",
    ]
    head = Path("/heads/h")
    found = candidates(Grid(methods=(), eagle_head=head, draft_model=Path("/d"), builtins=False))
    assert [c.k for c in found if c.family.startswith("eagle3")] == [1, 2, 3, 4]
    assert found[1].config == {"method": "eagle3", "model": "/heads/h", "num_speculative_tokens": 1}
    assert [c.config["method"] for c in found[1:] if c.config] == ["eagle3"] * 4 + [
        "draft_model"
    ] * 2


def test_scheduled_config_is_what_vllm_takes() -> None:
    member = candidates(QUICK)[2]
    config = member.scheduled([(1, 2, 3), (3, MAX_BATCH, 0)])
    assert config["num_speculative_tokens"] == 3
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, MAX_BATCH, 0]]
    assert config["method"] == "suffix"
    assert member.config is not None and "num_speculative_tokens_per_batch_size" not in (
        member.config
    )


# --- costs -----------------------------------------------------------------------------


def test_fit_costs_recovers_a_known_verification_slope(tmp_path: Path) -> None:
    plain = 0.05  # seconds per plain step

    def point(drafts: int, length: float, accepted: int, tokens: int, slope: float) -> CostPoint:
        steps = tokens - accepted
        seconds = (steps - drafts) * plain + drafts * plain * (1 + slope * length)
        return CostPoint(tokens, seconds, drafts, round(drafts * length), accepted)

    points = [point(40, 2.0, 30, 200, 0.1), point(60, 4.0, 50, 200, 0.1)]
    costs = fit_costs(plain, points, max_k=4)
    assert costs is not None
    assert costs.verify == pytest.approx((1.0, 1.1, 1.2, 1.3, 1.4))
    assert costs.draft_cost == 0 and costs.engine == "vllm"
    save_costs(costs, tmp_path / "costs.json", "test")
    assert load_costs(tmp_path / "costs.json").verify == pytest.approx(costs.verify)
    # Verification cheaper than a plain step reads as a flat curve, never below 1.
    cheap = [CostPoint(200, 5.0, 50, 100, 40)]
    flat = fit_costs(plain, cheap, max_k=2)
    assert flat is not None and flat.verify == (1.0, 1.0, 1.0)
    assert fit_costs(plain, [CostPoint(200, 10.0, 0, 0, 0)], max_k=2) is None


# --- prompts ---------------------------------------------------------------------------


def test_allot_gives_each_cell_prompts_of_its_own() -> None:
    test = load_prompts(split="test")
    cells = allot(test, (1, 2, 4), per_cell=4, rounds=3)
    ids = [p.id for round_ in cells for level in (1, 2, 4) for p in round_[level]]
    assert len(ids) == 36 and len(set(ids)) == 36
    assert len({p.category for p in cells[0][1]}) == 4  # categories taken in turn
    with pytest.raises(ValueError):
        allot(test[:5], (1, 2), per_cell=4)


# --- report ----------------------------------------------------------------------------


def batch(level: int, rate: float, drafted: int = 0, text: str = "same") -> Batch:
    return Batch(level, 4, int(rate * 10), 10.0, drafted // 2, drafted, drafted // 2, (text,) * 4)


def test_report_tables_and_plot(tmp_path: Path) -> None:
    found = candidates(QUICK)
    levels = (1, 2)
    plan = TunePlan(tmp_path, tuple(found), levels, {}, (), 32, 0.0, False, 2.0, tmp_path)
    screen = {
        c.name: {lv: batch(lv, 10.0 * lv * (1.2 if c.k else 1.0), c.k) for lv in levels}
        for c in found
    }
    confirm = {
        "off": [{lv: batch(lv, 10.0 * lv) for lv in levels} for _ in range(3)],
        SCHEDULE: [{lv: batch(lv, 12.0 * lv + r, 20) for lv in levels} for r in range(3)],
    }
    result = VllmTuneResult(
        plan,
        screen,
        found[2].family,
        {1: 3, 2: 3},
        confirm,
        {"off": None, SCHEDULE: {"method": "suffix"}},
        None,
        None,
        None,
    )
    data = result.to_json() | {"written_by": "spectune tune --engine vllm", "notes": []}
    json.dumps(data)  # the report is JSON
    assert data["confirm"][SCHEDULE]["greedy_equal_to_off"] == "24/24"
    assert data["confirm"][SCHEDULE]["levels"]["1"]["ratio"] == pytest.approx(1.3)
    (screen_table, confirm_table) = tables(data)
    assert [row[0] for row in screen_table[2]][0] == "off"
    assert confirm_table[2][1][1].startswith("13.0 ±0.6 (1.30x ±0.06)")
    assert "keep speculation off" in markdown(data)
    plot(data, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--k", "0"], "must be >= 1"),
        (["--ngram-lookup", "5:2"], "MIN:MAX"),
        (["--suffix-cache", "maybe"], "--suffix-cache"),
        (["--methods", "medusa"], "--methods"),
        (["--concurrency", "1,16"], "--per-cell 8 is under"),
        (["--per-cell", "30"], "dev split"),
        (["--temperatures", "0,1"], "one temperature"),
        (["--draft", "ngram"], "--eagle-head"),
        (["--eagle-head", "/nonexistent"], "config.json"),
        (["--noise-z", "-1"], "--noise-z"),
    ],
)
def test_bad_input_is_one_line_before_any_server(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "c.json"
    assert main(["tune", "--engine", "vllm", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_eagle_head_flag_wants_a_speculators_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    argv = ["tune", "--engine", "vllm", "--eagle-head", str(tmp_path)]
    assert main(argv) == 2
    assert "not a vLLM EAGLE-3 head" in capsys.readouterr().err


def test_decode_seconds_are_the_histograms_sum_over_its_label_sets() -> None:
    from spectune.engines.vllm.tune import decode_seconds
    from spectune.monitor.remote import Exposition

    exposition = """# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase.
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_bucket{le="1.0",model_name="a"} 1.0
vllm:request_decode_time_seconds_bucket{le="+Inf",model_name="a"} 2.0
vllm:request_decode_time_seconds_count{model_name="a"} 2.0
vllm:request_decode_time_seconds_sum{model_name="a"} 3.5
vllm:request_decode_time_seconds_sum{model_name="b"} 0.25
"""
    assert decode_seconds(Exposition.parse(exposition)) == 3.75
    assert decode_seconds(Exposition.parse("vllm:num_requests_running 1\n")) == 0.0


def test_a_one_k_method_speculates_at_one_k_or_not_at_all() -> None:
    """vLLM's suffix proposer asserts that every step's K equals num_speculative_tokens
    (a 0 range included): one K at every batch size, the one with the best geometric mean
    over the levels, kept only where it lost to off beyond the noise nowhere."""
    by_level = {
        1: {2: Ratio(1.20, 0.01, 3), 4: Ratio(1.30, 0.01, 3)},
        2: {2: Ratio(1.25, 0.01, 3), 4: Ratio(1.10, 0.01, 3)},
        4: {2: Ratio(1.05, 0.01, 3), 4: Ratio(0.90, 0.01, 3)},
        8: {2: Ratio(0.95, 0.01, 3), 4: Ratio(0.85, 0.01, 3)},
    }
    free, _ = build_schedule(by_level, z=2.0)
    assert free == {1: 4, 2: 2, 4: 2, 8: 0}
    k_at, ranges = build_schedule(by_level, z=2.0, one_k=True)
    assert k_at == {1: 2, 2: 2, 4: 2, 8: 2} and ranges == [(1, MAX_BATCH, 2)]
    vllm_accepts(ranges)
    losing = {1: Ratio(1.2, 0.01, 3), 2: Ratio(1.1, 0.01, 3), 4: Ratio(1.0, 0.01, 3)}
    losing[8] = Ratio(0.95, 0.01, 3)
    off = guard(k_at, losing, 2.0, one_k=True)
    assert off.ranges is None and off.reason and "concurrency 8" in off.reason
    within = dict(losing) | {8: Ratio(0.99, 0.01, 3)}
    kept = guard(k_at, within, 2.0, one_k=True)
    assert kept.ranges == [(1, MAX_BATCH, 2)] and kept.dropped == ()
    nothing = {1: {4: Ratio(0.99, 0.01, 3)}}
    assert build_schedule(nothing, z=2.0, one_k=True)[0] == {1: 0}
