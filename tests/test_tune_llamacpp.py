"""``spectune tune --engine llamacpp``: the flag grid, the measurement arithmetic, the verdict,
the draft's conversion to GGUF, bad input, and a CI-sized run against a real llama-server
(skipped, with the reason, where none is built)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gguf_files import Q, write_gguf
from spectune.cli import main
from spectune.engines.llamacpp.server import Candidate, Measured, default_server_binary
from spectune.engines.llamacpp.tuning import DEFAULTS_NAME, OFF_NAME, Row, flag_grid, verdict_of
from spectune.errors import InvalidParameterError
from spectune.models.gguf_write import write_draft_gguf
from spectune.models.loading import native_from_folder, native_from_gguf, save_native
from spectune.models.toy import toy_config, toy_model


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path / "cache"))  # converted drafts land here


def test_the_grid_is_off_then_the_defaults_then_each_point_once_then_ngram() -> None:
    grid = flag_grid(Path("d.gguf"), [1, 3, 8], [0.0, 0.5])
    names = [c.name for c in grid]
    assert names[:2] == [OFF_NAME, DEFAULTS_NAME] and grid[0].args == ()
    assert "draft n-max 3 p-min 0" not in names  # llama.cpp's defaults already are that point
    assert "draft n-max 3 p-min 0.5" in names and "draft n-max 8 p-min 0" in names
    assert len(grid) == 2 + (3 * 2 - 1) + 3 and len(set(names)) == len(names)
    assert grid[2].args[-4:] == ("--spec-draft-n-max", "1", "--spec-draft-p-min", "0")
    assert all(c.args[:2] == ("--spec-type", "ngram-simple") for c in grid[-3:])
    assert [c.name for c in flag_grid(None, [2], [0.0], ngram=False)] == [OFF_NAME]


def measured(seconds: float, text: str = "x", drafted: int = 0, accepted: int = 0) -> Measured:
    return Measured(10, seconds, seconds, drafted, accepted, text)


def test_speedup_is_the_geometric_mean_of_paired_ratios() -> None:
    off = Row(Candidate(OFF_NAME, ()))
    off.runs = {(0, "a"): measured(2.0), (0, "b"): measured(1.0)}
    fast = Row(Candidate("fast", ("--x",)))
    fast.runs = {(0, "a"): measured(1.0, drafted=8, accepted=6), (0, "b"): measured(0.5, "y")}
    summary = fast.summary(off)
    assert summary["speedup"] == pytest.approx(2.0) and summary["speedup_spread"] == 0.0
    assert summary["tokens_per_second"] == pytest.approx(20 / 1.5, abs=0.01)
    assert summary["acceptance"] == 0.75 and summary["greedy_equal"] == 1
    uneven = Row(Candidate("uneven", ()))
    uneven.runs = {(0, "a"): measured(1.0), (0, "b"): measured(2.0)}  # 2x, then 0.5x
    assert uneven.summary(off)["speedup"] == pytest.approx(1.0)


def test_the_verdict_keeps_off_unless_a_gain_is_beyond_the_noise() -> None:
    defaults = {"name": DEFAULTS_NAME, "speedup": 0.8, "speedup_spread": 0.05}
    off = {"name": OFF_NAME, "speedup": 1.0, "speedup_spread": 0.0}
    line, speculate = verdict_of(off, defaults)
    assert line.startswith("speculation off is fastest here") and "0.80x" in line
    assert not speculate
    small = {"name": "draft n-max 2 p-min 0.5", "speedup": 1.03, "speedup_spread": 0.05}
    line, speculate = verdict_of(small, defaults)
    assert line.startswith("nothing beats speculation off by more than the noise")
    assert "1.03x off ±0.05" in line and not speculate
    clear = {"name": "ngram-simple defaults", "speedup": 1.4, "speedup_spread": 0.05}
    line, speculate = verdict_of(clear, defaults)
    assert speculate and "1.40x off ±0.05" in line and "defaults: 0.80x" in line


@pytest.fixture
def target_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "target.gguf"
    config = toy_config(vocab_size=320, hidden_size=64)
    write_gguf(path, toy_model(5, config=config), Q.Q8_0, vocabulary=True)
    return path


def test_a_draft_folder_written_as_gguf_computes_the_same_logits(
    tmp_path: Path, target_gguf: Path
) -> None:
    draft = toy_model(7, config=toy_config(vocab_size=320, hidden_size=32, num_heads=4))
    folder = tmp_path / "draft"
    save_native(draft, folder)
    out = write_draft_gguf(folder, target_gguf, tmp_path / "draft.gguf")
    ids = torch.tensor([[1, 40, 41, 300, 7, 9]])
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    with torch.inference_mode():
        expected = native_from_folder(folder).net(ids, positions)[0]
        got = native_from_gguf(out).net(ids, positions)[0]  # F16 weights: close, not equal
    assert torch.allclose(got, expected, atol=2e-2, rtol=0)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_a_draft_of_another_vocabulary_or_no_folder_is_refused(
    tmp_path: Path, target_gguf: Path
) -> None:
    folder = tmp_path / "small"
    save_native(toy_model(7, config=toy_config(vocab_size=96)), folder)
    with pytest.raises(InvalidParameterError, match="vocabulary 96 against the target's 320"):
        write_draft_gguf(folder, target_gguf, tmp_path / "x.gguf")
    with pytest.raises(InvalidParameterError, match="not a draft folder"):
        write_draft_gguf(tmp_path, target_gguf, tmp_path / "x.gguf")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--server-binary", "/no/such/llama-server"], "no llama-server at /no/such"),
        (["--temperatures", "0.7"], "measures greedy decoding"),
        (["--draft", "none"], "tuning needs a drafter"),
        (["--draft", "no-such-draft"], "a .gguf file or a spectune distill --kind lm folder"),
        (["--draft", "."], "a .gguf file or a spectune distill --kind lm folder"),  # no weights
        (["--n-max", "0"], "--n-max values must be >= 1"),
        (["--rounds", "0"], "--rounds must be >= 1"),
    ],
)
def test_bad_llamacpp_tuning_input_is_one_line(
    tmp_path: Path,
    target_gguf: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("")  # present: the checks before it starts come first
    args = ["tune", "--engine", "llamacpp", "--server-binary", str(binary)]
    args += ["--target", str(target_gguf), "--draft", "ngram", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.skipif(
    default_server_binary() is None,
    reason="no llama-server binary (set LLAMA_SERVER, put it on PATH, or run "
    "scripts/build-llama-server.sh)",
)
def test_tuning_a_real_llama_server_writes_the_fastest_measured_flags(
    tmp_path: Path, target_gguf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "draft"  # a distill --kind lm folder, converted on the way
    save_native(toy_model(6, config=toy_config(vocab_size=320, hidden_size=32)), folder)
    out = tmp_path / "flags.json"
    args = ["tune", "--engine", "llamacpp", "--target", str(target_gguf), "--draft", str(folder)]
    args += ["--n-max", "2", "--p-min", "0", "--categories", "code,translation"]
    args += ["--limit-per-category", "1", "--confirm-prompts", "2", "--rounds", "1"]
    args += ["--finalists", "1", "--max-tokens", "8", "--threads", "1", "--out", str(out)]
    assert main(args) == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal width
    data = json.loads(out.read_text())
    assert data["engine"] == "llamacpp" and len(data["screen"]) == 6
    names = [row["name"] for row in data["confirm"]]
    assert OFF_NAME in names and DEFAULTS_NAME in names and len(names) == 3
    fastest = max(data["confirm"], key=lambda row: row["tokens_per_second"])
    assert data["fastest"] == fastest and data["verdict"] in printed
    assert data["winner"] in (fastest, next(r for r in data["confirm"] if r["name"] == OFF_NAME))
    assert all(row["requests"] == 2 and row["tokens"] == 16 for row in data["confirm"])
    off = next(row for row in data["confirm"] if row["name"] == OFF_NAME)
    assert off["speedup"] == 1.0 and off["acceptance"] is None
    assert data["command"].startswith("llama-server --model ")
    for arg in data["winner"]["args"]:
        assert arg in data["command"]
