"""Models whose files do not hold the weights their config describes are refused (issue 17):
a ``gpt2`` config over Llama tensors would otherwise load with random weights. An expert
flag downgrades the refusal to a warning. Also the start-up line and the stalled-drafter
warning of ``generate``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spectune.cli import main
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.scripted import FailingDrafter
from spectune.errors import ModelLoadError, SpectuneWarning
from spectune.models.llama import LlamaLM
from spectune.models.loading import load_model, save_native
from spectune.models.toy import toy_model
from spectune.monitor.hub import STALL_STEPS, Monitor
from spectune.sampling import SamplingParams
from spectune.server.testing import toy_tokenizer


@pytest.fixture(scope="module")
def mislabelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose config.json says gpt2 while its safetensors hold Llama tensors."""
    from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("mislabelled")
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    llama.save_pretrained(str(folder))
    GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=128).save_pretrained(
        str(folder)
    )
    toy_tokenizer(folder, 64)
    return folder


def test_mislabelled_folder_is_refused(mislabelled: Path) -> None:
    with pytest.raises(ModelLoadError, match="weights the model expects are missing") as info:
        load_model(mislabelled)
    message = str(info.value)
    assert "transformer.h.0.attn.c_attn.bias" in message  # names a few missing weights
    assert "model.embed_tokens.weight" in message  # and a few unused tensors
    assert "--allow-missing-weights" in message
    assert "\n" not in message


def test_mislabelled_folder_loads_with_the_flag_and_a_warning(mislabelled: Path) -> None:
    with pytest.warns(SpectuneWarning, match="randomly initialised"):
        model = load_model(mislabelled, allow_missing_weights=True)
    assert model.info.family == "gpt2"


def test_mislabelled_folder_through_the_cli(
    mislabelled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["generate", "w1 w2", "--target", str(mislabelled), "--draft", "none"])
    err = capsys.readouterr().err
    assert status == 2
    lines = [line for line in err.splitlines() if line.startswith("spectune:")]
    assert len(lines) == 1 and lines[0].startswith("spectune: error: ")
    assert "weights the model expects are missing" in lines[0]
    assert "Traceback" not in err
    status = main(
        [
            "generate", "w1 w2", "--target", str(mislabelled), "--draft", "none",
            "--max-tokens", "3", "--json", "--allow-missing-weights",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 0
    assert "spectune: warning: --allow-missing-weights:" in err


def test_native_loader_refuses_unused_and_missing_tensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    save_native(toy_model(0), folder)
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    state["model.layers.0.self_attn.extra.weight"] = torch.zeros(2, 2)
    save_file(state, str(weights))
    with pytest.raises(ModelLoadError, match=r"1 tensors in the files are not used .*extra"):
        load_model(folder)
    del state["model.layers.0.self_attn.extra.weight"], state["model.norm.weight"]
    save_file(state, str(weights))
    with pytest.raises(ModelLoadError, match=r"1 weights the model expects .*\(norm.weight\)"):
        load_model(folder)
    with pytest.warns(SpectuneWarning, match="norm.weight"):
        load_model(folder, allow_missing_weights=True)


@pytest.fixture(scope="module")
def toy_folder(toy_target: LlamaLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toy")
    save_native(toy_target, folder)
    toy_tokenizer(folder, 64)
    return folder


def test_generate_names_the_active_drafter(
    toy_folder: Path, tmp_path: Path, toy_draft: LlamaLM, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["generate", "w1 w2 w3", "--target", str(toy_folder), "--max-tokens", "4", "--json"]
    assert main([*base, "--policy", "fixed", "--k", "3"]) == 0
    err = capsys.readouterr().err
    assert "spectune: drafter ngram (prompt lookup); policy fixed (k=3)" in err
    assert main([*base, "--draft", "none"]) == 0
    assert "spectune: drafter none (plain decoding); no speculation" in capsys.readouterr().err

    draft = tmp_path / "draft"
    save_native(toy_draft, draft)  # no tokenizer
    assert main([*base, "--draft", str(draft)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "token strings could not be compared" in err and "--trust-draft-vocab" in err
    assert main([*base, "--draft", str(draft), "--trust-draft-vocab"]) == 0
    err = capsys.readouterr().err
    assert "spectune: warning: --trust-draft-vocab: the draft ships no tokenizer" in err
    assert "spectune: drafter model:draft (draft model); policy cost" in err


@pytest.fixture(scope="module")
def endless() -> LlamaLM:
    """The toy target without an EOS token, so runs last max_tokens steps."""
    import dataclasses

    from spectune.models.toy import toy_config

    return toy_model(0, config=dataclasses.replace(toy_config(), eos_token_ids=()), scale=3.0)


def test_stalled_speculation_is_warned_once(endless: LlamaLM) -> None:
    """A drafter that fails on every step: the first STALL_STEPS steps all fall back for one
    reason, which the monitor reports once (not again for the next request)."""
    heard: list[str] = []
    monitor = Monitor(on_warning=heard.append)
    engine = SpeculativeEngine(endless, FailingDrafter("nan", vocab_size=64))
    params = SamplingParams(max_tokens=STALL_STEPS + 4)
    for _ in range(2):
        watch = monitor.request()
        for record in watch.watch(engine.generate([1, 5, 9], params)):
            assert record.fallback is not None
    assert len(heard) == 1
    assert heard[0].startswith(f"the first {STALL_STEPS} steps of request 0 all fell back")
    assert "drafter_error: draft probabilities hold NaN" in heard[0]


def test_no_stall_warning_for_short_or_drafting_runs(endless: LlamaLM) -> None:
    from spectune.drafters.model import ModelDrafter
    from spectune.models.toy import perturbed

    heard: list[str] = []
    monitor = Monitor(on_warning=heard.append)
    failing = SpeculativeEngine(endless, FailingDrafter("nan", vocab_size=64))
    short = SamplingParams(max_tokens=STALL_STEPS - 1)
    list(monitor.request().watch(failing.generate([1, 5, 9], short)))
    drafting = SpeculativeEngine(endless, ModelDrafter(perturbed(endless, 0.3)))
    params = SamplingParams(max_tokens=3 * STALL_STEPS)
    list(monitor.request().watch(drafting.generate([1, 5, 9], params)))
    assert heard == []


def test_generate_prints_the_stall_warning(
    toy_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import spectune.drafters.pairing as pairing

    # the command line looks the drafter's loader up when it runs
    monkeypatch.setattr(
        pairing, "load_drafter", lambda *a, **kw: FailingDrafter("raise", vocab_size=64)
    )
    args = ["generate", "w1 w2 w3", "--target", str(toy_folder), "--json", "--policy", "fixed"]
    assert main([*args, "--max-tokens", str(2 * STALL_STEPS)]) == 0
    err = capsys.readouterr().err
    assert "spectune: drafter failing:raise (FailingDrafter); policy fixed" in err
    assert f"spectune: warning: the first {STALL_STEPS} steps of request 0 all fell back" in err
    assert "all fell back to plain decoding: drafter_error: scripted drafter failure" in err


def test_serve_names_the_active_drafter(
    toy_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from spectune.server import run as server_run  # serve imports listen/serve_on from it

    # Bind a free loopback port and return instead of serving forever.
    real_listen = server_run.listen
    monkeypatch.setattr(server_run, "listen", lambda host, port: real_listen("127.0.0.1", 0))
    monkeypatch.setattr(server_run, "serve_on", lambda app, sock, **kw: None)
    monkeypatch.delenv("SPECTUNE_API_KEY", raising=False)
    args = ["serve", "--target", str(toy_folder), "--engine", "sequential", "--k", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert (
        "spectune: drafter ngram (prompt lookup); policy cost (initial_k=2); "
        "engine sequential" in err
    )
