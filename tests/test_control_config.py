"""Policies by name, options from TOML files and --policy-opt, typed errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectune.cli import build_parser
from spectune.cli.policy_args import policy_spec_from_args
from spectune.control import (
    POLICIES,
    CostK,
    FixedK,
    Guarded,
    KPolicy,
    LocalFallback,
    ThresholdK,
    build_policy,
    load_policy_file,
    make_policy,
    parse_policy_opts,
    policy_spec,
)
from spectune.control.costs import CostCurve
from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams


def test_every_policy_builds_by_name_and_follows_the_protocol() -> None:
    assert POLICIES == ("threshold", "cost", "fixed")
    for name in POLICIES:
        policy = make_policy(name)
        assert isinstance(policy, KPolicy)
        assert policy.plan().k == 4
    assert isinstance(make_policy("fixed"), FixedK)
    assert make_policy("fixed", {"k": 0}).plan().k == 0  # plain decoding, the baseline
    threshold = make_policy("threshold")
    assert isinstance(threshold, Guarded) and isinstance(threshold.inner, ThresholdK)
    assert [c.kind for c in threshold.checks] == ["global", "local"]


def test_the_cost_curve_reaches_the_cost_policy_and_the_global_check() -> None:
    curve = CostCurve((1, 2), (0.01, 0.011))
    policy = make_policy("cost", cost_curve=curve)
    assert isinstance(policy, Guarded) and isinstance(policy.inner, CostK)
    assert policy.inner.learned.prior is curve  # the shape it calibrates
    assert policy.checks[0].cost_curve is curve  # type: ignore[attr-defined]


def test_each_call_builds_fresh_state() -> None:
    first, second = make_policy("threshold"), make_policy("threshold")
    assert isinstance(first, Guarded) and isinstance(second, Guarded)
    assert first.inner is not second.inner and first.checks[0] is not second.checks[0]


def test_policy_opts_are_typed_toml_values() -> None:
    opts = parse_policy_opts(
        ["raise_above=0.85", "window=6", "local.bad_steps=7", 'checks=["local"]', "x=word"]
    )
    assert opts == {
        "raise_above": 0.85,
        "window": 6,
        "local": {"bad_steps": 7},
        "checks": ["local"],
        "x": "word",
    }
    with pytest.raises(InvalidParameterError, match="key=value"):
        parse_policy_opts(["raise_above"])


def test_policy_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(
        'name = "threshold"\ninitial_k = 3\n[local]\nbad_steps = 8\nbackoff_tokens = 4\n'
    )
    spec = load_policy_file(path)
    assert spec.name == "threshold" and spec.options["local"]["bad_steps"] == 8
    spec = policy_spec(None, path, ["local.bad_steps=6", "max_k=6"])
    assert spec.options == {
        "initial_k": 3,
        "max_k": 6,
        "local": {"bad_steps": 6, "backoff_tokens": 4},
    }
    policy = build_policy(spec, params=SamplingParams())
    assert isinstance(policy, Guarded) and isinstance(policy.inner, ThresholdK)
    assert policy.inner.config.max_k == 6 and policy.plan().k == 3
    local = policy.checks[1]
    assert isinstance(local, LocalFallback) and local.config.bad_steps == 6
    assert policy_spec("cost", path).name == "cost"  # --policy beats the file's name


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("nope", {}, "unknown policy 'nope'"),
        ("threshold", {"raise_abve": 0.9}, "unknown threshold option"),
        ("threshold", {"window": "four"}, "threshold.window must be an integer"),
        ("threshold", {"window": 2.5}, "threshold.window must be an integer"),
        ("threshold", {"raise_above": True}, "must be a number"),
        ("cost", {"checks": ["locl"]}, "option checks"),
        ("cost", {"local": {"bad_step": 3}}, "unknown local option"),
        ("fixed", {"global": {"max_draft_ratio": 0}}, "max_draft_ratio must be > 0"),
        ("fixed", {"k": 40}, "K"),
        ("cost", {"smoothing": 0.0}, "smoothing"),
    ],
)
def test_bad_options_are_one_line_typed_errors(
    name: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        make_policy(name, options)


def test_bad_policy_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="cannot read"):
        load_policy_file(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(InvalidParameterError, match="not valid TOML"):
        load_policy_file(broken)


def test_cli_k_is_the_fixed_or_initial_k(tmp_path: Path) -> None:
    parser = build_parser()

    def spec_of(*argv: str):  # type: ignore[no-untyped-def]
        return policy_spec_from_args(parser.parse_args(["generate", "hi", *argv]))

    assert spec_of().name == "cost" and spec_of().options == {}  # the default policy
    assert spec_of("-k", "3").options == {"initial_k": 3}
    assert spec_of("--policy", "fixed", "-k", "2").options == {"k": 2}
    # --policy-opt has the last word.
    assert spec_of("-k", "3", "--policy-opt", "initial_k=5").options == {"initial_k": 5}
    with pytest.raises(InvalidParameterError):
        spec_of("-k", "0")
    path = tmp_path / "p.toml"
    path.write_text('name = "cost"\nmargin = 0.1\n')
    spec = spec_of("--policy-file", str(path), "-k", "6")
    assert spec.name == "cost" and spec.options == {"margin": 0.1, "initial_k": 6}


def test_generate_reports_bad_policy_options_before_loading_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from spectune.cli import main

    code = main(["generate", "hi", "--policy-opt", "local.bad_steps=0", "--target", "/nope"])
    assert code == 2
    assert "local.bad_steps must be in [1, 64]" in capsys.readouterr().err
