"""``spectune export``: select/bench results into vLLM, SGLang and llama.cpp flags."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.engines.llamacpp.flags import LLAMACPP_VERSION, to_llamacpp
from spectune.engines.sglang.flags import to_sglang
from spectune.engines.tuned import Tuning, read_tuning
from spectune.engines.vllm.flags import to_vllm
from spectune.errors import InvalidParameterError


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return path


SELECT = {
    "target": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "recommendation": {
        "draft": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "k": 5,
        "predicted_speedup": 1.8,
        "measured_speedup": 1.6,
    },
    "candidates": [],
}


def test_select_result_to_vllm(tmp_path: Path) -> None:
    tuning = read_tuning(write(tmp_path, {**SELECT, "speculate_max_batch": 8}))
    assert tuning == Tuning(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        5,
        8,
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        str(tmp_path / "result.json"),
    )
    plan = to_vllm(tuning)
    words = shlex.split(plan.command)
    assert words[:3] == ["vllm", "serve", "HuggingFaceTB/SmolLM2-1.7B-Instruct"]
    config = json.loads(words[words.index("--speculative-config") + 1])
    assert config == {
        "method": "draft_model",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "num_speculative_tokens": 5,
        "disable_by_batch_size": 8,
    }
    # A hub id is passed on as one, and said so: it is not a path here.
    assert len(plan.notes) == 1 and "hub id" in plan.notes[0]


def lm_folder(path: Path) -> Path:
    """A folder that reads as a spectune distill --kind lm draft (no weights needed to
    tell its kind)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "spectune_draft.json").write_text(json.dumps({"kind": "lm"}))
    return path


def test_sglang_chain_flags(tmp_path: Path) -> None:
    draft = lm_folder(tmp_path / "draft").resolve()
    plan = to_sglang(Tuning(str(draft), 3, target="/models/target"))
    flags = dict(zip(plan.args[::2], plan.args[1::2], strict=True))
    assert flags == {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": str(draft),
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "4",
    }
    assert shlex.split(plan.command)[:5] == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/target",
    ]


def test_bench_rows_pick_the_best_spectune_setup(tmp_path: Path) -> None:
    rows = [
        {
            "system": "spectune",
            "drafter": "ngram",
            "k": 4,
            "speedup_vs_plain": 1.2,
            "category": "code",
        },
        {
            "system": "spectune",
            "drafter": "ngram",
            "k": 4,
            "speedup_vs_plain": 1.0,
            "category": "chat",
        },
        {
            "system": "spectune",
            "drafter": "draft-a",
            "k": 3,
            "speedup_vs_plain": 1.5,
            "category": "code",
        },
        {
            "system": "spectune",
            "drafter": "draft-a",
            "k": 3,
            "speedup_vs_plain": 1.3,
            "category": "chat",
        },
        {
            "system": "hf-assisted",
            "drafter": "draft-b",
            "k": 5,
            "speedup_vs_plain": 3.0,
            "category": "chat",
        },
        {
            "system": "spectune",
            "drafter": None,
            "k": None,
            "speedup_vs_plain": 1.0,
            "category": "chat",
        },
    ]
    tuning = read_tuning(write(tmp_path, {"config": {"target": "t"}, "rows": rows}))
    assert (tuning.draft, tuning.k, tuning.target) == ("draft-a", 3, "t")


def test_k_by_batch_size_gives_the_threshold(tmp_path: Path) -> None:
    data = {"draft": "ngram", "k_by_batch_size": {"1": 5, "4": 3, "8": 2, "16": 0, "32": 0}}
    tuning = read_tuning(write(tmp_path, data))
    assert (tuning.k, tuning.speculate_max_batch) == (5, 8)
    config = to_vllm(tuning).speculative_config
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
        "disable_by_batch_size": 8,
    }
    assert any("batch size" in note for note in to_sglang(tuning).notes)


def test_threshold_below_two_is_a_note_for_vllm() -> None:
    plan = to_vllm(Tuning("org/d", 2, speculate_max_batch=1, target="t"))
    assert "disable_by_batch_size" not in plan.speculative_config
    assert any(">= 2" in note for note in plan.notes)


@pytest.mark.parametrize(
    "data",
    [
        {"candidates": []},
        {"recommendation": {"draft": "d", "k": 0}},
        {"draft": "d", "k": "4"},
        [1, 2],
    ],
)
def test_unusable_results_are_clear_errors(tmp_path: Path, data: object) -> None:
    with pytest.raises(InvalidParameterError):
        to_vllm(read_tuning(write(tmp_path, data)))


def test_cli_overrides_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, SELECT)
    assert main(["export", str(path), "--to", "vllm", "--k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["speculative_config"]["num_speculative_tokens"] == 3
    assert main(["export", "--to", "sglang", "--draft", "ngram", "--k", "4"]) == 0
    assert "--speculative-algorithm NGRAM" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "missing.json"), "--to", "vllm"]) == 2
    assert main(["export", "--to", "vllm", "--k", "4"]) == 2


# llama-server flags as spelled in common/arg.cpp of the llama.cpp vendored by
# llama-cpp-python 0.3.36 (ggml-org/llama.cpp@0c1e57098, read from the sdist, not built),
# and the ones that version removed (they fail with "the argument has been removed").
LLAMA_SERVER_FLAGS = {
    "--model",
    "--spec-type",
    "--spec-draft-model",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "--spec-draft-p-min",
    "--spec-ngram-simple-size-n",
    "--spec-ngram-simple-size-m",
}
LLAMA_SERVER_REMOVED = {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min"}
LLAMA_SPEC_TYPES = {"draft-simple", "ngram-simple"}


def _flags(words: list[str]) -> dict[str, str]:
    return dict(zip(words[1::2], words[2::2], strict=True))


def test_llamacpp_draft_model_flags(tmp_path: Path) -> None:
    draft = (tmp_path / "draft.gguf").resolve()
    draft.write_bytes(b"GGUF")
    plan = to_llamacpp(Tuning(str(draft), 5, target="/models/target.gguf"))
    words = shlex.split(plan.command)
    assert words[0] == "llama-server"
    flags = _flags(words)
    assert set(flags) <= LLAMA_SERVER_FLAGS and not set(flags) & LLAMA_SERVER_REMOVED
    assert flags == {
        "--model": "/models/target.gguf",
        "--spec-type": "draft-simple",  # without it a plain draft GGUF is never used
        "--spec-draft-model": str(draft),
        "--spec-draft-n-max": "5",
        "--spec-draft-n-min": "0",
        "--spec-draft-p-min": "0",
    }
    assert plan.args == words[3:]
    assert LLAMACPP_VERSION in " ".join(plan.notes)
    assert not any("GGUF" in note for note in plan.notes)


def test_llamacpp_ngram_flags_and_notes() -> None:
    plan = to_llamacpp(Tuning("ngram", 4, speculate_max_batch=8))
    flags = _flags(shlex.split(plan.command))
    assert set(flags) <= LLAMA_SERVER_FLAGS and flags["--spec-type"] in LLAMA_SPEC_TYPES
    assert flags["--spec-ngram-simple-size-m"] == "4"
    assert flags["--spec-ngram-simple-size-n"] == "3"
    notes = " ".join(plan.notes)
    assert "--parallel" in notes  # no per-batch switch in llama-server
    assert "GGUF" in notes  # the placeholder target is not a GGUF file


def test_llamacpp_wants_gguf_drafts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = lm_folder(tmp_path / "draft")
    argv = ["export", "--to", "llamacpp", "--draft", str(draft), "--k", "3", "--json"]
    assert main([*argv, "--target", "t.gguf"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "GGUF" in captured.err and "spectune tune --engine llamacpp" in captured.err
