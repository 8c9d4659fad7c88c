"""``advise --engine``: which engine measured what (said in the output and advice.json), the
engine's spellings, and a verdict not to speculate with its next step."""

from __future__ import annotations

import shlex

import pytest

from spectune.advise.engine import measured_on, stated
from spectune.advise.schema import Advice
from spectune.advise.verdict import DO_NOT_SPECULATE, NO_VERDICT, Verdict
from spectune.cli import main
from spectune.engines.names import engine_name
from spectune.engines.plan import plain_command
from spectune.errors import InvalidParameterError
from spectune.models.llamacpp import llama_cpp_available
from spectune.models.loading import default_target_path


def test_llamacpp_is_measured_on_llama_cpp_kernels_where_they_run() -> None:
    measured = measured_on("llamacpp", "default", "auto")
    if llama_cpp_available():
        assert measured.runtime == "llamacpp"
        assert "llama.cpp's kernels" in measured.statement
        assert "llama-server's own drafting" in measured.statement
    else:
        assert measured.runtime == "auto" and "not llama.cpp's" in measured.statement


def test_a_runtime_given_keeps_it_and_says_the_figures_are_spectunes() -> None:
    measured = measured_on("llamacpp", "default", "native")
    assert measured.runtime == "native"
    assert "spectune's runtime's (--runtime native), not llama.cpp's" in measured.statement
    assert "spectune tune --engine llamacpp" in measured.statement


def test_vllm_and_sglang_figures_are_said_to_be_spectunes() -> None:
    for engine, label in (("vllm", "vLLM"), ("sglang", "SGLang")):
        # vLLM not installed (with it, advise runs its pick on vLLM: test_advise_vllm.py)
        measured = measured_on(engine, "default", "auto", vllm_ready=False)
        assert measured.runtime == "auto" and f"not {label}'s" in measured.statement
    assert measured_on("spectune", "default", "auto").statement.startswith("measured on spectune")


def _advice(summary: str, speculate: bool = False) -> Advice:
    verdict = Verdict(speculate, None, summary, ("why",))
    return Advice("default", 1, {}, {}, (), (), verdict, (), (), {}, 1.0)


@pytest.mark.parametrize("engine", ["spectune", "vllm", "sglang", "llamacpp"])
def test_do_not_speculate_gives_the_command_that_serves_without_speculation(engine: str) -> None:
    measured = measured_on(engine, "default", "native")
    advice = stated(_advice(DO_NOT_SPECULATE), measured, "default")
    step = advice.verdict.reasons[-1]
    assert step.startswith("next step: serve without speculation: ")
    command = shlex.split(step.split(": ", 2)[2])
    assert "--speculative-config" not in command and "--spec-type" not in command
    if engine == "spectune":
        assert command[-2:] == ["--draft", "none"]
    else:
        assert str(default_target_path().resolve()) in command  # the file, not "default"
    data = advice.to_dict()
    assert data["settings"]["measured_on"]["engine"] == engine
    assert data["notes"][0] == measured.statement
    busy = stated(_advice(NO_VERDICT), measured, "default")  # rerun first: no serving step
    assert busy.verdict.reasons == ("why",)


def test_plain_commands() -> None:
    path = str(default_target_path().resolve())
    assert plain_command("llamacpp", "default") == shlex.join(["llama-server", "--model", path])
    assert plain_command("vllm", "org/model") == "vllm serve org/model"


def test_both_spellings_of_llama_cpp_are_read_as_one() -> None:
    assert engine_name("llama.cpp") == engine_name("llamacpp") == "llamacpp"
    with pytest.raises(InvalidParameterError, match="llamacpp \\(or llama.cpp\\)"):
        engine_name("tgi")


@pytest.mark.parametrize("spelling", ["llamacpp", "llama.cpp"])
def test_export_takes_either_spelling(spelling: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["export", "--to", spelling, "--target", "default", "--draft", "ngram"] + ["--k", "2"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(
        "llama-server --model " + shlex.quote(str(default_target_path().resolve()))
    )


def test_a_feature_head_for_llama_cpp_is_refused_with_what_to_use(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["export", "--to", "llama.cpp", "--target", "default", "--draft", "smollm2-draft"]
    assert main([*args, "--k", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spectune: error: llama.cpp cannot load draft smollm2-draft")
    assert "feature head" in err and "use --draft ngram" in err and err.count("\n") == 1
