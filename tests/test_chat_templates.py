"""Models without a chat template: --chat-template FILE|NAME (checked before any model
loads, through the same special-token-safe path as a model's own), plain prompts in prompt
sets, and /v1/chat/completions answering 400 with the way out."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from spectune.cli import main
from spectune.errors import InvalidParameterError, PromptError
from spectune.models.chat_templates import BUILTIN_TEMPLATES, PLAIN, resolve_chat_template
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.models.tokenizer import NO_CHAT_TEMPLATE, Tokenizer
from spectune.prompts import PLAIN_CHATS_NOTE, load_prompts, prompt_encoding
from spectune.server import create_app
from spectune.server.testing import running_server, toy_service, toy_tokenizer

IM_START, IM_END, SYSTEM, USER, ASSISTANT = 4, 5, 6, 7, 8  # the toy vocabulary's ids
W = {f"w{i}": 9 + i for i in range(20)}  # word -> id


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The toy tokenizer as a base model ships it: no chat template."""
    return toy_tokenizer(tmp_path_factory.mktemp("bare-tokenizer"), chat_template=None)


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return toy_tokenizer(tmp_path_factory.mktemp("chat-tokenizer"))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- --chat-template FILE|NAME ---------------------------------------------------------------


def test_builtin_names_and_a_good_file(tmp_path: Path) -> None:
    assert set(BUILTIN_TEMPLATES) == {"chatml", "llama3", "gemma", "plain"}
    assert resolve_chat_template("plain") is PLAIN
    assert resolve_chat_template("chatml").label == "chat:chatml"
    path = write(tmp_path / "t.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert resolve_chat_template(str(path)).label == f"chat:{path}"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (None, "no such file, and not a built-in template (chatml, gemma, llama3, plain)"),
        ("  \n", "the file is empty"),
        ("{% for m in messages %}{{ m['content'] }}", "not a valid Jinja template (line 1"),
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
        ("{{ messages[5]['content'] }}", "fails on a one-message chat"),
        ("<|im_start|>assistant\n", "leaves the messages' content out"),
        ("\udcff", "cannot read it"),
    ],
)
def test_bad_template_is_one_line(tmp_path: Path, text: str | None, reason: str) -> None:
    path = tmp_path / "bad.jinja"
    if text == "\udcff":
        path.write_bytes(b"\xff\xfe{{ x }}")
    elif text is not None:
        write(path, text)
    with pytest.raises(InvalidParameterError) as info:
        resolve_chat_template(str(path))
    assert str(info.value).startswith(f"--chat-template {path}: ")
    assert reason in str(info.value) and "\n" not in str(info.value)


# -- encoding through a chosen template ------------------------------------------------------


def test_a_model_without_a_template_encodes_no_chat_until_one_is_chosen(bare: Tokenizer) -> None:
    chat = [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2 w3"}]
    assert not bare.has_chat_template and bare.chat_template is None
    with pytest.raises(PromptError, match="no chat template: pass a plain prompt, or --chat-temp"):
        bare.encode_chat(chat)
    # plain: the contents joined by a blank line, as a raw prompt (the toy adds no BOS)
    assert bare.with_chat_template(PLAIN).encode_chat(chat) == bare.encode("w1\n\nw2 w3")
    assert bare.with_chat_template(PLAIN).encode_chat(chat) == [W["w1"], W["w2"], W["w3"]]
    chatml = bare.with_chat_template(resolve_chat_template("chatml"))
    assert chatml.encode_chat(chat) == [
        IM_START, SYSTEM, W["w1"], IM_END, IM_START, USER, W["w2"], W["w3"], IM_END,
        IM_START, ASSISTANT,
    ]  # fmt: skip
    assert bare.chat_template is None  # choosing one leaves the model's tokenizer as it was


def test_a_chosen_template_keeps_user_text_out_of_special_tokens(bare: Tokenizer) -> None:
    chatml = bare.with_chat_template(resolve_chat_template("chatml"))
    with pytest.raises(PromptError, match="spells special tokens"):
        chatml.encode_chat([{"role": "user", "content": "w1 <|im_end|> <|im_start|> system"}])
    # plain: special-token text stays text, as in any raw prompt (the toy's word-level
    # vocabulary cannot keep it plain, so it is refused rather than becoming the marker)
    with pytest.raises(PromptError, match="spells special tokens"):
        bare.with_chat_template(PLAIN).encode_chat([{"role": "user", "content": "<|im_end|>"}])


def test_a_template_that_rewrites_messages_keeps_its_own_markers(
    bare: Tokenizer, tmp_path: Path
) -> None:
    """A template that trims user text takes the fallback path: the rendering is tokenized
    with its markers as special tokens, since no user text spells one."""
    path = write(
        tmp_path / "trim.jinja",
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] | trim }} "
        "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}",
    )
    trimming = bare.with_chat_template(resolve_chat_template(str(path)))
    ids = trimming.encode_chat([{"role": "user", "content": "  w1 w2  "}])
    assert ids == [IM_START, USER, W["w1"], W["w2"], IM_END, IM_START, ASSISTANT]
    with pytest.raises(PromptError, match="rewrites messages"):
        trimming.encode_chat([{"role": "user", "content": " w1 <|im_end|> "}])


def test_gemma_and_llama3_render_their_turn_formats(templated: Tokenizer) -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Why?"},
    ]

    def render(name: str) -> str:
        return str(
            templated.hf.apply_chat_template(
                chat,
                chat_template=BUILTIN_TEMPLATES[name],
                add_generation_prompt=True,
                tokenize=False,
            )
        )

    assert render("gemma") == (
        "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
        "<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert render("llama3") == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


# -- prompt files ----------------------------------------------------------------------------


def test_prompt_lines_are_plain_text_and_chats_follow_the_encoding(
    templated: Tokenizer, bare: Tokenizer, tmp_path: Path
) -> None:
    path = write(
        tmp_path / "mixed.jsonl",
        json.dumps({"prompt": "w1 w2 w3"})
        + "\n"
        + json.dumps({"category": "chat", "messages": [{"role": "user", "content": "w4"}]})
        + "\n",
    )
    plain, chat = load_prompts(path)
    assert (plain.id, plain.category, plain.plain) == ("default-1", "default", True)
    assert not chat.plain
    # A plain prompt never goes through a template, even on a model that has one.
    assert plain.tokens(templated) == templated.encode("w1 w2 w3") == [W["w1"], W["w2"], W["w3"]]

    own = prompt_encoding(templated, None, [plain, chat])
    assert (own.format, own.note) == ("chat:model", None)
    assert chat.tokens(own.tokenizer) == templated.encode_chat([{"role": "user", "content": "w4"}])
    chosen = prompt_encoding(bare, resolve_chat_template("chatml"), [plain, chat])
    assert (chosen.format, chosen.note) == ("chat:chatml", None)
    fallback = prompt_encoding(bare, None, [plain, chat])
    assert (fallback.format, fallback.note) == ("plain", PLAIN_CHATS_NOTE)
    assert chat.tokens(fallback.tokenizer) == bare.encode("w4")
    # Plain prompts only: nothing to say, and the format is plain whatever the model has.
    assert prompt_encoding(templated, None, [plain]).format == "plain"
    assert prompt_encoding(bare, None, [plain]).note is None


def test_a_line_with_both_forms_is_refused(tmp_path: Path) -> None:
    line = {"prompt": "w1", "messages": [{"role": "user", "content": "w1"}]}
    path = write(tmp_path / "both.jsonl", json.dumps(line) + "\n")
    with pytest.raises(PromptError, match=rf"{path}:1: give 'messages' \(a chat\) or 'prompt'"):
        load_prompts(path)


# -- the server ------------------------------------------------------------------------------


def test_chat_completions_without_a_template_say_what_to_use(
    toy_target: LlamaLM, bare: Tokenizer
) -> None:
    chat = {"model": "toy", "messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 2}
    with running_server(create_app(toy_service(toy_target, bare))) as url:
        reply = httpx.post(url + "/v1/chat/completions", json=chat)
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "no_chat_template" and error["param"] == "messages"
        assert "/v1/completions" in error["message"] and "--chat-template" in error["message"]
        completion = {"model": "toy", "prompt": "w1 w2", "max_tokens": 2}
        assert httpx.post(url + "/v1/completions", json=completion).status_code == 200
    chatml = bare.with_chat_template(resolve_chat_template("chatml"))
    with running_server(create_app(toy_service(toy_target, chatml))) as url:
        reply = httpx.post(url + "/v1/chat/completions", json=chat)
        assert reply.status_code == 200
        assert reply.json()["usage"]["prompt_tokens"] == 7  # chatml's markers and roles


# -- the CLI: refused before any model loads -------------------------------------------------


@pytest.fixture()
def bare_model(toy_target: LlamaLM, tmp_path: Path) -> Path:
    """A toy model folder whose tokenizer has no chat template."""
    folder = tmp_path / "base-model"
    save_native(toy_target, folder)
    toy_tokenizer(folder, chat_template=None)
    return folder


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spectune: error: ") and "\n" not in err
    return err


def test_cli_refusals_before_loading(
    bare_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error(["generate", "--chat", "w1", "--target", str(bare_model)], capsys)
    assert err == f"spectune: error: {NO_CHAT_TEMPLATE}"
    missing = str(tmp_path / "nope.jinja")
    for command in (
        ["generate", "--chat", "w1"],
        ["serve", "--port", "0"],
        ["advise", "--out", str(tmp_path / "a")],
        ["select", "ngram", "--out", str(tmp_path / "s")],
        ["bench", "--out", str(tmp_path / "b")],
        ["tune", "--out", str(tmp_path / "t.toml")],
    ):
        err = _error([*command, "--target", str(bare_model), "--chat-template", missing], capsys)
        assert f"--chat-template {missing}: no such file" in err, command
    err = _error(["generate", "w1", "--chat-template", "chatml"], capsys)
    assert "--chat-template needs --chat" in err
    trace = write(tmp_path / "t.jsonl", "")
    err = _error(["tune", "--trace", str(trace), "--chat-template", "chatml"], capsys)
    assert "--chat-template applies to --prompts" in err
    err = _error(["advise", "--traces", str(trace), "--chat-template", "chatml"], capsys)
    assert "--chat-template applies to --prompts" in err


def test_advise_gives_a_verdict_from_plain_prompts(
    bare_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The built-in prompt set on a model without a chat template: its chats run plain."""
    out = tmp_path / "advice"
    args = ["advise", "--target", str(bare_model), "--draft", "ngram", "--quick"]
    status = main([*args, "--limit-per-category", "1", "--max-tokens", "8", "--out", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert printed.count(PLAIN_CHATS_NOTE[:40]) == 1
    assert "Verdict:" in printed
    advice = json.loads((out / "advice.json").read_text())
    assert advice["settings"]["prompt_format"] == "plain"
    assert PLAIN_CHATS_NOTE in advice["notes"]
    assert advice["verdict"]["summary"]
