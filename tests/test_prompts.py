"""The shipped evaluation prompt set and the JSONL loader's validation."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from spectune.errors import PromptError
from spectune.prompts import CATEGORIES, EvalPrompt, default_prompts_path, load_prompts


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def good(i: int = 0, category: str = "translation") -> dict[str, Any]:
    return {
        "id": f"x-{i}",
        "category": category,
        "messages": [{"role": "user", "content": f"Translate {i} into French."}],
    }


# ---- the shipped set ---------------------------------------------------------------------


def test_shipped_set_has_twenty_per_category_and_unique_ids() -> None:
    prompts = load_prompts()
    counts = Counter(p.category for p in prompts)
    assert set(counts) == set(CATEGORIES)
    assert all(counts[c] >= 20 for c in CATEGORIES), counts
    assert len({p.id for p in prompts}) == len(prompts)


def test_shipped_set_dev_split_is_five_per_category() -> None:
    dev = load_prompts(split="dev")
    test = load_prompts(split="test")
    assert Counter(p.category for p in dev) == dict.fromkeys(CATEGORIES, 5)
    assert all(n >= 15 for n in Counter(p.category for p in test).values())
    assert not {p.id for p in dev} & {p.id for p in test}
    assert len(dev) + len(test) == len(load_prompts())


def test_shipped_set_shapes() -> None:
    for p in load_prompts():
        assert p.messages[-1]["role"] == "user"
        roles = [m["role"] for m in p.messages]
        if p.category == "multi_turn_chat":
            # alternating user/assistant turns, at least two user turns
            assert len(roles) >= 3
            assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        else:
            assert roles == ["user"]
        if p.category == "retrieval_qa":
            assert "Passage:" in p.messages[0]["content"]
            assert "Question:" in p.messages[0]["content"]


def test_default_path_is_inside_the_package() -> None:
    path = default_prompts_path()
    assert path.is_file()
    assert path.parts[-3:] == ("assets", "prompts", "eval.jsonl")


def test_package_data_ships_the_assets() -> None:
    """A non-editable install only carries eval.jsonl if package-data names it."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    assert "assets/**/*" in config["tool"]["setuptools"]["package-data"]["spectune"]


def test_filters() -> None:
    some = load_prompts(categories=["math_reasoning", "translation"], limit_per_category=3)
    assert Counter(p.category for p in some) == {"math_reasoning": 3, "translation": 3}
    with pytest.raises(PromptError, match="no prompts in categories"):
        load_prompts(categories=["maths"])
    with pytest.raises(PromptError, match="limit_per_category"):
        load_prompts(limit_per_category=0)


# ---- user files --------------------------------------------------------------------------


def test_user_file_with_unknown_category_and_prompt_shorthand(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        json.dumps({"category": "poetry", "prompt": "Write a limerick about a cat."})
        + "\n\n"  # a blank line is skipped
        + json.dumps(good(1))
        + "\n",
        encoding="utf-8",
    )
    first, second = load_prompts(path)
    assert first == EvalPrompt(
        id="poetry-1",
        category="poetry",
        messages=({"role": "user", "content": "Write a limerick about a cat."},),
        split="test",
        plain=True,  # the prompt form: plain text, no chat template
    )
    assert second.id == "x-1" and second.category == "translation"


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ('{"category": "qa", "prompt": "hi"', "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"category": 3, "prompt": "hi"}', "'category' must be a non-empty string"),
        ('{"category": "", "prompt": "hi"}', "'category' must be a non-empty string"),
        ('{"category": "qa", "messages": []}', "'messages' must be a non-empty list"),
        ('{"category": "qa", "messages": [{"role": "robot", "content": "hi"}]}', "role 'robot'"),
        ('{"category": "qa", "messages": [{"role": "user", "content": ""}]}', "non-empty string"),
        (
            '{"category": "qa", "messages": [{"role": "user", "content": "hi"},'
            ' {"role": "assistant", "content": "hello"}]}',
            "last message must be from the user",
        ),
        ('{"category": "qa", "prompt": 3}', "'prompt' must be a non-empty string"),
        ('{"category": "qa"}', "needs 'messages'"),
        ('{"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}', "not both"),
        ('{"prompt": "\\ud800"}', "'prompt' is not valid UTF-8"),
        ('{"category": "qa", "prompt": "hi", "split": 1}', "'split'"),
        ('{"id": "x-0", "category": "qa", "prompt": "again"}', "duplicate id 'x-0'"),
    ],
)
def test_bad_line_names_file_line_and_reason(tmp_path: Path, bad_line: str, reason: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good(0)) + "\n" + bad_line + "\n", encoding="utf-8")
    with pytest.raises(PromptError) as info:
        load_prompts(path)
    message = str(info.value)
    assert f"{path}:2:" in message
    assert reason in message


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="not found"):
        load_prompts(tmp_path / "nope.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(PromptError, match="empty"):
        load_prompts(empty)


def test_split_filter_that_leaves_nothing(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [good(0), good(1)])
    with pytest.raises(PromptError, match="no prompts left"):
        load_prompts(path, split="dev")


# ---- with the real tokenizer -------------------------------------------------------------


@pytest.mark.slow
def test_tokens_with_the_real_tokenizer_fit_in_400(smollm2: Any) -> None:
    tokenizer = smollm2.tokenizer
    lengths = {}
    for p in load_prompts():
        tokens = p.tokens(tokenizer)
        assert all(isinstance(t, int) for t in tokens)
        text = tokenizer.hf.decode(tokens)
        assert p.messages[-1]["content"][:40] in text  # the template kept the last turn
        lengths[p.id] = len(tokens)
    too_long = {k: n for k, n in lengths.items() if n > 400}
    assert not too_long, too_long
    assert min(lengths.values()) >= 20
