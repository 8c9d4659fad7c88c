"""The experiment commands run and report (on toy models), and the crossover round-trips
into BatchEngine. Benchmarks are not timed tests: no figure is checked here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spectune.cli import main
from spectune.control.crossover import load_crossover, save_crossover
from spectune.decode.batch import BatchEngine
from spectune.drafters import ModelDrafter, NgramDrafter
from spectune.drafters.batched import PerRow
from spectune.experiments.batching import BatchPoint, crossover
from spectune.models.llama import LlamaLM


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.parametrize(
    "argv, key",
    [
        (
            ["tree", "--budgets", "4", "--temperatures", "0,0.7", "--max-tokens", "8"],
            "tree_vs_chain",
        ),
        (["batch", "--sizes", "1,2", "-k", "1,3", "--max-tokens", "6", "--repeats", "2"], "points"),
        (["chunked", "--ks", "4", "--groups", "2", "--max-tokens", "8"], "rows"),
    ],
)
def test_experiment_commands_run_on_toy_models(
    private_cache: Path, argv: list[str], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = private_cache / "result.json"
    assert main(["experiment", *argv, "--toy", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report[key]
    assert "toy" in report["setup"]
    assert capsys.readouterr().out  # a table was printed


def test_runtimes_experiment_records_each_runtimes_curve_for_this_machine(
    private_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``experiment runtimes`` compares the runtimes and leaves each one's verification
    curve where generate and serve start the cost policy from."""
    from spectune.control.crossover import load_verify_curve
    from spectune.experiments.common import toy_setup
    from spectune.models.devices import machine_of

    out = private_cache / "runtimes.json"
    argv = ["experiment", "runtimes", "--toy", "--precisions", "fp32,bf16", "--max-tokens", "4"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["precision"] for r in report["runtimes"]] == ["fp32", "bf16"]
    assert "recorded the verification curves" in capsys.readouterr().out
    target = toy_setup().target
    for runtime in ("fp32", "bf16"):
        curve = load_verify_curve(target.info, runtime, machine_of(target))
        assert curve is not None and curve.seconds[0] == 1.0 and len(curve.sizes) > 4


def test_precision_needs_the_real_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "batch", "--toy", "--precision", "int4"]) != 0
    assert "--precision" in capsys.readouterr().err


def point(batch: int, speculative: bool, seconds: float, k: int = 4) -> BatchPoint:
    return BatchPoint(batch, k if speculative else 0, tokens=100, steps=10, seconds=seconds)


def test_crossover_is_the_last_size_where_speculation_still_wins() -> None:
    points = [
        point(1, False, 2.0), point(1, True, 1.0),
        point(2, False, 2.0), point(2, True, 1.5),
        point(4, False, 2.0), point(4, True, 2.5),
        point(8, False, 2.0), point(8, True, 1.0),  # a later win does not count
    ]  # fmt: skip
    assert crossover(points) == 2
    assert crossover([point(1, False, 1.0), point(1, True, 2.0)]) == 0
    # Speculation counts at its best K: a slow K = 4 does not hide a fast K = 1.
    mixed = [point(1, False, 2.0), point(1, True, 3.0), point(1, True, 1.5, k=1)]
    assert crossover(mixed) == 1


def test_batch_engine_reads_the_recorded_crossover(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    draft_name = f"model:{toy_draft.info.name}"
    assert load_crossover(toy_target.info, draft_name) is None
    assert BatchEngine(toy_target, ModelDrafter(toy_draft)).speculate_max_batch is None
    save_crossover(toy_target.info, 3, {"ks": [4]}, draft=draft_name)
    assert load_crossover(toy_target.info, draft_name) == 3
    assert load_crossover(toy_target.info, "ngram") is None  # measured for another draft
    assert BatchEngine(toy_target, ModelDrafter(toy_draft)).speculate_max_batch == 3
    assert BatchEngine(toy_target, PerRow(NgramDrafter)).speculate_max_batch is None
    assert (
        BatchEngine(toy_target, ModelDrafter(toy_draft), speculate_max_batch=16).speculate_max_batch
        == 16
    )
    save_crossover(toy_target.info, 2, {})  # a draft-agnostic value covers other drafts
    assert BatchEngine(toy_target, PerRow(NgramDrafter)).speculate_max_batch == 2
    assert (
        BatchEngine(toy_target, ModelDrafter(toy_draft)).speculate_max_batch == 3
    )  # the specific wins


def test_each_runtime_has_its_own_crossover(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    """A crossover measured on int4 kernels is not the fp32 one: a faster one-token forward
    makes verification relatively dearer. fp32 keeps the old key (shipped entries hold)."""
    import copy

    from spectune.control.crossover import runtime_of
    from spectune.models.quant import quantize_net

    draft_name = f"model:{toy_draft.info.name}"
    net = copy.deepcopy(toy_target.net)
    quantize_net(net, "int8")
    quantised = LlamaLM(net)
    assert (runtime_of(toy_target), runtime_of(quantised)) == ("fp32", "int8")
    save_crossover(toy_target.info, 3, {}, draft=draft_name)
    save_crossover(quantised.info, 1, {}, draft=draft_name, runtime="int8")
    assert BatchEngine(toy_target, ModelDrafter(toy_draft)).speculate_max_batch == 3
    assert BatchEngine(quantised, ModelDrafter(toy_draft)).speculate_max_batch == 1
    assert load_crossover(toy_target.info, draft_name, "int4") is None  # never measured


def test_shipped_crossover_is_the_fallback(
    toy_target: LlamaLM, toy_draft: LlamaLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spectune.control.crossover as crossover_module

    key = f"{toy_target.info.name}|{toy_target.info.num_parameters}|model:{toy_draft.info.name}"
    monkeypatch.setattr(crossover_module, "_shipped", lambda: {key: {"speculate_max_batch": 4}})
    assert BatchEngine(toy_target, ModelDrafter(toy_draft)).speculate_max_batch == 4
    save_crossover(toy_target.info, 1, {}, draft=f"model:{toy_draft.info.name}")
    assert (
        BatchEngine(toy_target, ModelDrafter(toy_draft)).speculate_max_batch == 1
    )  # this machine's first


def test_unreadable_crossover_files_mean_not_measured(
    toy_target: LlamaLM, private_cache: Path
) -> None:
    from spectune.control.crossover import crossover_path

    crossover_path().parent.mkdir(parents=True, exist_ok=True)
    for text in ("{not json", "[1, 2]", '{"toy-0|1|*": {"speculate_max_batch": "many"}}'):
        crossover_path().write_text(text)
        assert load_crossover(toy_target.info) is None


def test_shipped_crossover_file_is_well_formed() -> None:
    """Each entry holds a crossover, or (under a draft-agnostic key) a verification curve,
    with the command that measured it."""
    from spectune.control.crossover import _shipped

    for key, entry in _shipped().items():
        assert key.count("|") in (2, 3), key  # target|parameters|draft[|runtime]
        assert "speculate_max_batch" in entry or "verify_curve" in entry, key
        if "speculate_max_batch" in entry:
            assert isinstance(entry["speculate_max_batch"], int)
            assert entry["command"].startswith("spectune experiment batch"), key
        if "verify_curve" in entry:
            assert key.split("|")[2] == "*", key
            assert entry["verify_curve_command"].startswith("spectune experiment runtimes"), key


def test_verification_curves_come_from_this_machine_first_then_the_shipped_file(
    toy_target: LlamaLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per runtime; a malformed curve counts as never measured."""
    import spectune.control.crossover as crossover_module
    from spectune.control.crossover import crossover_path, load_verify_curve, verify_curve_of

    key = f"{toy_target.info.name}|{toy_target.info.num_parameters}|*"
    shipped = {
        f"{key}|int4": {"verify_curve": {"sizes": [1, 2, 4], "relative": [1.0, 1.3, 1.9]}},
        key: {"verify_curve": {"sizes": [2, 1], "relative": [1.0, 1.0]}},  # not ascending
    }
    monkeypatch.setattr(crossover_module, "_shipped", lambda: shipped)
    curve = load_verify_curve(toy_target.info, "int4")
    assert curve is not None and curve.sizes == (1, 2, 4) and curve.relative(3) == 1.9
    assert verify_curve_of(toy_target) is None  # fp32: only a malformed entry
    assert load_verify_curve(toy_target.info, "int8") is None
    crossover_path().parent.mkdir(parents=True, exist_ok=True)
    local = {f"{key}|int4": {"verify_curve": {"sizes": [1, 2], "relative": [1.0, 1.1]}}}
    crossover_path().write_text(json.dumps(local))
    mine = load_verify_curve(toy_target.info, "int4")
    assert mine is not None and mine.sizes == (1, 2)
    local[f"{key}|int4"]["verify_curve_machine"] = "another CPU, 64 cores, 64 threads"
    crossover_path().write_text(json.dumps(local))
    shipped_again = load_verify_curve(toy_target.info, "int4", "this CPU, 2 cores, 2 threads")
    assert shipped_again is not None and shipped_again.sizes == (1, 2, 4)  # not another's


def test_a_machine_without_a_curve_of_its_own_measures_it_once(toy_target: LlamaLM) -> None:
    """Measured, recorded under this machine, then read back without measuring again."""
    from spectune.control.crossover import (
        CURVE_REVISION,
        MEASURED_SIZES,
        crossover_path,
        curve_for_this_machine,
        verify_curve_of,
    )
    from spectune.models.devices import machine_of

    heard: list[str] = []
    curve = curve_for_this_machine(toy_target, repeats=1, report=heard.append)
    assert curve.sizes == MEASURED_SIZES and curve.seconds[0] == 1.0
    assert len(heard) == 1 and "measured the verification-cost curve" in heard[0]
    (entry,) = json.loads(crossover_path().read_text()).values()
    assert entry["verify_curve_machine"] == machine_of(toy_target)
    again = curve_for_this_machine(toy_target, repeats=1, report=heard.append)
    assert len(heard) == 1 and again.sizes == curve.sizes  # recorded: not measured again
    assert again.seconds == pytest.approx(curve.seconds, abs=1e-4)
    assert verify_curve_of(toy_target) == again
    threads = torch.get_num_threads()
    try:  # another thread count is another machine: measured, beside this one's
        torch.set_num_threads(threads + 1)
        curve_for_this_machine(toy_target, repeats=1, report=heard.append)
        assert len(heard) == 2
    finally:
        torch.set_num_threads(threads)
    curve_for_this_machine(toy_target, repeats=1, report=heard.append)
    assert len(heard) == 2  # the first machine's curve is still recorded
    # A record from older kernels (no revision, or another) is measured again.
    recorded = json.loads(crossover_path().read_text())
    key = f"{toy_target.info.name}|{toy_target.info.num_parameters}|*@{machine_of(toy_target)}"
    assert key in recorded
    for entry in recorded.values():
        del entry["verify_curve_revision"]
    crossover_path().write_text(json.dumps(recorded))
    curve_for_this_machine(toy_target, repeats=1, report=heard.append)
    assert len(heard) == 3
    assert json.loads(crossover_path().read_text())[key]["verify_curve_revision"] == CURVE_REVISION


def test_a_curve_measured_on_a_busy_machine_serves_but_is_not_recorded(
    toy_target: LlamaLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A curve timed while other processes took the cores prices the contention: the run
    uses it, the next run measures again (SPECTUNE_BUSY_CORES=0 counts any load as busy)."""
    from spectune.control.crossover import crossover_path, curve_for_this_machine

    monkeypatch.setenv("SPECTUNE_BUSY_CORES", "0")
    heard: list[str] = []
    curve = curve_for_this_machine(toy_target, repeats=1, report=heard.append)
    assert curve.seconds[0] == 1.0 and curve.spread is not None
    assert len(heard) == 1 and "busy machine" in heard[0] and "not recorded" in heard[0]
    assert not crossover_path().exists()
    monkeypatch.setenv("SPECTUNE_BUSY_CORES", "inf")
    curve_for_this_machine(toy_target, repeats=1, report=heard.append)
    assert "recorded in" in heard[1]
    (entry,) = json.loads(crossover_path().read_text()).values()
    assert entry["verify_curve_load"]["busy"] is False
    assert entry["verify_curve_spread"] >= 0


@pytest.mark.slow
def test_the_default_target_has_a_shipped_verification_curve_per_runtime(smollm2) -> None:  # type: ignore[no-untyped-def]
    """What the cost policy of generate and serve starts from on a fresh machine: flat on
    fp32, dear on int4 and llama.cpp (measured)."""
    from spectune.control.crossover import load_verify_curve

    curves = {
        runtime: load_verify_curve(smollm2.model.info, runtime)
        for runtime in ("fp32", "bf16", "int8", "int4", "llamacpp")
    }
    assert all(curve is not None for curve in curves.values()), curves
    assert curves["fp32"].relative(4) < 1.3 < curves["int4"].relative(4)  # type: ignore[union-attr]
    assert curves["int4"].relative(4) < curves["llamacpp"].relative(4)  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_default_target_with_the_shipped_draft_has_a_shipped_crossover(smollm2) -> None:  # type: ignore[no-untyped-def]
    """On a fresh machine (no measurement of its own) the batch engine still turns
    speculation off above the crossover measured on this project's CPU."""
    from spectune.control.crossover import _shipped

    key = f"{smollm2.model.info.name}|{smollm2.model.info.num_parameters}|feature:smollm2-draft"
    assert key in _shipped(), "the shipped crossover no longer matches the default target"
    assert (
        load_crossover(smollm2.model.info, "feature:smollm2-draft")
        == (_shipped()[key]["speculate_max_batch"])
    )
