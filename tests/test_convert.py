"""``spectune convert``: a GGUF or native target as a Hugging Face folder, its logits equal to
spectune's own runtime's (transformers loads the folder), a second conversion reused from
the record, and bad input refused in one line."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gguf_files import Q, write_gguf
from spectune.cli import main
from spectune.engines import hf_folder
from spectune.engines.hf_folder import (
    LOGIT_TOLERANCE,
    RECORD,
    check_logits,
    compare_logits,
    convert_target,
)
from spectune.errors import InvalidParameterError, ModelLoadError
from spectune.models.loading import save_native
from spectune.models.toy import toy_config, toy_model
from spectune.server.testing import toy_tokenizer

PROMPTS = ("a b c d", "hello there", "one two one two three")


@pytest.fixture(scope="module")
def gguf_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("convert") / "toy.gguf"
    write_gguf(
        path,
        toy_model(5, config=toy_config(vocab_size=320, hidden_size=64)),
        Q.Q8_0,
        vocabulary=True,
    )
    return path


def test_a_gguf_becomes_a_folder_with_the_same_logits(gguf_target: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    conversion = convert_target(gguf_target, out)
    assert not conversion.reused and conversion.check is None
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", RECORD} <= names
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    from transformers import AutoTokenizer

    chat = AutoTokenizer.from_pretrained(str(out)).apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "hi" in chat and chat != "hi"  # the GGUF's chat template came along
    check = check_logits(gguf_target, out, PROMPTS)
    assert check.passed and check.argmax_equal
    assert check.max_relative_diff <= LOGIT_TOLERANCE and check.positions > len(PROMPTS)


def test_the_check_fails_on_a_folder_with_other_weights(gguf_target: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    convert_target(gguf_target, out)
    weights = out / "model.safetensors"
    state = load_file(str(weights))
    name = "model.layers.1.mlp.down_proj.weight"
    state[name] = state[name] * 1.5  # one layer off by half: logits move, top tokens too
    save_file(state, str(weights))
    check = check_logits(gguf_target, out, PROMPTS)
    assert not check.passed and check.max_relative_diff > LOGIT_TOLERANCE


def test_a_second_conversion_reads_the_record(
    gguf_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "hf"
    first = convert_target(gguf_target, out)
    check = check_logits(gguf_target, out, PROMPTS)
    hf_folder.record_check(out, check)

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded again")

    monkeypatch.setattr(hf_folder, "load_model", no_loading)
    again = convert_target(gguf_target, out)
    assert again.reused and again.sha256 == first.sha256 and again.check == check
    # Touched (new time, same bytes): hashed again, still the same source.
    stat = gguf_target.stat()
    os.utime(gguf_target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert convert_target(gguf_target, out).reused
    monkeypatch.undo()
    # Other bytes: converted again.
    other = tmp_path / "other.gguf"
    write_gguf(
        other,
        toy_model(6, config=toy_config(vocab_size=320, hidden_size=64)),
        Q.Q8_0,
        vocabulary=True,
    )
    redone = convert_target(other, out)
    assert not redone.reused and redone.sha256 != first.sha256 and redone.check is None


def test_a_qwen2_folder_keeps_its_q_k_v_biases(tmp_path: Path) -> None:
    cfg = dataclasses.replace(
        toy_config(vocab_size=64), attention_bias=True, family="qwen2", name="toy-qwen2"
    )
    model = toy_model(3, config=cfg)
    with torch.no_grad():
        for block in model.net.layers:
            block.self_attn.q_proj.bias.normal_()  # zero biases would prove nothing
    source = tmp_path / "qwen2"
    save_native(model, source, extra_config={"model_type": "qwen2"})
    toy_tokenizer(source)
    out = tmp_path / "hf"
    convert_target(source, out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    # The toy word tokenizer in a qwen2 folder: transformers picks Qwen2's tokenizer class
    # for it, so the check runs on token ids.
    assert compare_logits(source, out, ([10, 11, 12], [13, 14, 13, 14, 5])).passed


def test_bad_input_is_one_line_before_loading(
    gguf_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hello")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    cases = [
        (["--target", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "a")], "not found"),
        (["--target", str(not_a_model), "--out", str(tmp_path / "a")], "not a .gguf"),
        (["--target", str(gpt2), "--out", str(tmp_path / "a")], "Llama-family"),
        (["--target", str(gguf_target), "--out", str(not_a_model)], "is a file"),
        (["--target", str(gguf_target), "--out", str(foreign)], "holds other files"),
        (["--target", str(gguf_target), "--out", str(gguf_target.parent)], "own folder"),
    ]
    for args, message in cases:
        assert main(["convert", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("spectune: error: ") and message in err and err.count("\n") == 1
    assert (foreign / "keep.txt").read_text() == "mine"
    with pytest.raises(ModelLoadError):
        convert_target(gpt2, tmp_path / "b")
    with pytest.raises(InvalidParameterError):
        convert_target(gguf_target, foreign)


def test_convert_command_writes_checks_and_then_reuses(
    gguf_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hf"
    assert main(["convert", "--target", str(gguf_target), "--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert first.startswith("wrote: ") and "checked: logits" in first
    assert "same top token: yes" in first
    assert main(["convert", "--target", str(gguf_target), "--out", str(out)]) == 0
    second = capsys.readouterr().out
    assert second.startswith("up to date: ") and "checked when written" in second
