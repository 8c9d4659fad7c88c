"""``spectune export`` over every kind of draft and every engine: each cell is either a
configuration naming something the engine loads, or a one-line refusal with exit status 2.

What an engine loads (as of the versions ``spectune.export`` writes for): vLLM's
``draft_model`` and SGLang's ``STANDALONE`` a standalone causal LM as a Hugging Face folder or
hub id, llama.cpp's ``draft-simple`` one as a GGUF file; model-free drafting as the engine's
own method (vLLM ``ngram``/``suffix``, SGLang ``NGRAM``, llama.cpp ``ngram-simple``). No
engine loads an EAGLE-style feature head as a draft model.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from spectune.cli import main
from spectune.engines.drafts import DRAFT_TEMPLATE, resolve_draft
from spectune.engines.export import export
from spectune.engines.tuned import Tuning
from spectune.models.loading import default_target_path
from spectune.models.shipped import shipped_draft_path

ROOT = Path(__file__).resolve().parents[1]
README_RESULTS = ROOT / "docs" / "results" / "readme" / "results.json"
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}


def _folder(path: Path, config: dict[str, Any], meta: dict[str, Any] | None) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if meta is not None:
        (path / "spectune_draft.json").write_text(json.dumps(meta))
    return str(path)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One draft spec per kind; telling a kind apart reads only the folder's JSON files."""
    root = tmp_path_factory.mktemp("drafts")
    gguf = root / "draft.gguf"
    gguf.write_bytes(b"GGUF")
    return {
        "feature head (shipped name)": "smollm2-draft",
        "feature head (folder)": _folder(
            root / "head", {"model_type": "spectune-feature-head"}, {"kind": "feature"}
        ),
        "feature head (config only)": _folder(
            root / "bare-head", {"model_type": "spectune-feature-head"}, None
        ),
        "lm folder (distilled)": _folder(root / "lm", {"model_type": "llama"}, {"kind": "lm"}),
        "lm folder (hf)": _folder(root / "hf", {"model_type": "qwen2"}, None),
        "lm gguf": str(gguf),
        "hub id": "org/draft-lm",
        "suffix": "suffix",
        "suffix index": "suffix:none",
        "ngram": "ngram",
        "hybrid": "hybrid",
        "hybrid (explicit)": "suffix+ngram",
        "none": "none",
        "missing": str(root / "no-such-draft"),
    }


# kind -> engine -> what the engine is handed: a method name, or None for a refusal.
TABLE: dict[str, dict[str, str | None]] = {
    "feature head (shipped name)": {"vllm": None, "sglang": None, "llamacpp": None},
    "feature head (folder)": {"vllm": None, "sglang": None, "llamacpp": None},
    "feature head (config only)": {"vllm": None, "sglang": None, "llamacpp": None},
    "lm folder (distilled)": {"vllm": "draft_model", "sglang": "STANDALONE", "llamacpp": None},
    "lm folder (hf)": {"vllm": "draft_model", "sglang": "STANDALONE", "llamacpp": None},
    "lm gguf": {"vllm": None, "sglang": None, "llamacpp": "draft-simple"},
    "hub id": {"vllm": "draft_model", "sglang": "STANDALONE", "llamacpp": None},
    "suffix": {"vllm": "suffix", "sglang": "NGRAM", "llamacpp": None},
    "suffix index": {"vllm": "suffix", "sglang": "NGRAM", "llamacpp": None},
    "ngram": {"vllm": "ngram", "sglang": "NGRAM", "llamacpp": "ngram-simple"},
    "hybrid": {"vllm": None, "sglang": None, "llamacpp": None},
    "hybrid (explicit)": {"vllm": None, "sglang": None, "llamacpp": None},
    "none": {"vllm": None, "sglang": None, "llamacpp": None},
    "missing": {"vllm": None, "sglang": None, "llamacpp": None},
}
CELLS = [(kind, engine) for kind, row in TABLE.items() for engine in row]


def _flags(args: list[str]) -> dict[str, str]:
    return dict(zip(args[::2], args[1::2], strict=True))


def _standalone_lm(location: str) -> bool:
    """A hub id, or a folder holding a causal LM (not a feature head)."""
    path = Path(location)
    if not path.exists():
        return location.count("/") == 1 and not location.startswith(("/", "."))
    config = json.loads((path / "config.json").read_text())
    return bool(path.is_dir() and config["model_type"] != "spectune-feature-head")


def _loaded(engine: str, plan: dict[str, Any]) -> tuple[str, str | None]:
    """The method a plan hands ``engine`` and the draft it names (None: model-free)."""
    if engine == "vllm":
        config = plan["speculative_config"]
        return config["method"], config.get("model")
    flags = _flags(plan["args"])
    if engine == "sglang":
        return flags["--speculative-algorithm"], flags.get("--speculative-draft-model-path")
    return flags["--spec-type"], flags.get("--spec-draft-model")


@pytest.mark.parametrize(("kind", "engine"), CELLS)
def test_every_cell_is_a_loadable_config_or_a_one_line_refusal(
    kind: str, engine: str, drafts: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = drafts[kind]
    argv = ["export", "--to", engine, "--draft", spec, "--k", "3", "--target", "default"]
    status = main([*argv, "--json"])
    captured = capsys.readouterr()
    expected = TABLE[kind][engine]
    if expected is None:
        assert status == 2 and captured.out == ""
        assert captured.err.startswith("spectune: error: ") and captured.err.count("\n") == 1
        if kind.startswith("feature head"):
            assert "feature head" in captured.err and ENGINE_LABELS[engine] in captured.err
        return
    assert status == 0, captured.err
    plan = json.loads(captured.out)
    method, draft = _loaded(engine, plan)
    assert method == expected
    if method in ("draft_model", "STANDALONE"):
        assert draft is not None and _standalone_lm(draft)
    elif method == "draft-simple":
        assert draft is not None and draft.endswith(".gguf") and Path(draft).is_file()
    else:
        assert draft is None
    # Paths are paths: 'default' is the target's file, never the word.
    words = shlex.split(plan["command"])
    flag = {"vllm": "serve", "sglang": "--model-path", "llamacpp": "--model"}[engine]
    named = words[words.index(flag) + 1]
    assert named == str(default_target_path()) and Path(named).is_file()


def test_names_resolve_to_paths() -> None:
    head = shipped_draft_path("smollm2-draft")
    assert head is not None
    ref = resolve_draft("smollm2-draft")
    assert (ref.kind, ref.location) == ("feature-head", str(head))
    assert resolve_draft("default").location == str(default_target_path())
    assert resolve_draft("model:smollm2-draft").kind == "feature-head"  # a drafter's own name


@pytest.mark.parametrize("spelling", ["llamacpp", "llama.cpp"])
def test_llamacpp_target_is_the_default_gguf(
    spelling: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--to", spelling, "--target", "default", "--draft", "ngram", "--k", "4"]
    assert main(argv) == 0
    command = capsys.readouterr().out.splitlines()[0]
    words = shlex.split(command)
    assert words[:3] == ["llama-server", "--model", str(default_target_path())]
    assert "default" not in words


def test_llamacpp_refuses_a_target_that_is_no_gguf(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", "--to", "llamacpp", "--target", "org/model", "--draft", "ngram", "--k", "4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGUF" in err


def test_readme_results_export_the_best_setup_each_engine_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its best row is the shipped feature head: vLLM and SGLang get the best row they can
    load (suffix), with a note naming what was skipped and why; llama.cpp loads none of its
    drafts (feature head, hybrid, suffix) and is refused."""
    for engine, method in (("vllm", "suffix"), ("sglang", "NGRAM")):
        assert main(["export", str(README_RESULTS), "--to", engine, "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert _loaded(engine, plan) == (method, None)
        skipped = [n for n in plan["notes"] if n.startswith("skipped")]
        assert skipped and "smollm2-draft" in skipped[0] and "feature head" in skipped[0]
    assert main(["export", str(README_RESULTS), "--to", "llamacpp"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "feature head" in captured.err and "--draft ngram" in captured.err


def test_bench_rows_fall_back_in_rank_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"system": "spectune", "drafter": d, "k": k, "speedup_vs_plain": s, "category": "all"}
        for d, k, s in (("smollm2-draft", 3, 1.6), ("suffix", 4, 1.3), ("ngram", 2, 1.1))
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"config": {"target": "default"}, "rows": rows}))
    assert main(["export", str(path), "--to", "llama.cpp", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert _loaded("llamacpp", plan) == ("ngram-simple", None)
    assert _flags(plan["args"])["--spec-ngram-simple-size-m"] == "2"  # the ngram row's K
    skipped = [n for n in plan["notes"] if n.startswith("skipped")]
    assert [n.split(" K=")[0] for n in skipped] == ["skipped smollm2-draft", "skipped suffix"]
    # An explicit --draft replaces the file's ranking, and is refused on its own.
    assert main(["export", str(path), "--to", "vllm", "--draft", "smollm2-draft"]) == 2
    assert "feature head" in capsys.readouterr().err


def test_the_draft_template_is_api_only(capsys: pytest.CaptureFixture[str]) -> None:
    """``monitor.watch`` takes the K flags from a plan for a draft the user fills in."""
    for engine in ENGINE_LABELS:
        plan = export(Tuning(DRAFT_TEMPLATE, 3, target="TARGET_MODEL"), engine)
        assert DRAFT_TEMPLATE in plan.command
        assert any(DRAFT_TEMPLATE in note for note in plan.notes)
    assert main(["export", "--to", "vllm", "--draft", DRAFT_TEMPLATE, "--k", "3"]) == 2
    assert "placeholder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "vllm", "--draft", "smollm2-draft"], "feature head"),
        (["--engine", "llama.cpp"], "loads none of the default drafts"),
        (["--engine", "llamacpp", "--target", "{folder}", "--draft", "ngram"], "GGUF"),
    ],
)
def test_advise_refuses_an_engine_that_cannot_load_its_drafts_before_any_work(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path / "hf-target", {"model_type": "llama"}, None)  # not a GGUF
    argv = [arg.format(folder=folder) for arg in argv]
    assert main(["advise", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spectune: error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "out").exists()
