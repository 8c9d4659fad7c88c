"""Pairing a draft with a target: every compatibility check names what differs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from spectune.drafters.pairing import check_compatible, compatibility_problems
from spectune.errors import IncompatibleModelsError
from spectune.models.base import ModelInfo
from spectune.models.tokenizer import Tokenizer
from spectune.server.testing import toy_tokenizer

TARGET = ModelInfo(
    name="target",
    family="llama",
    vocab_size=64,
    max_context=128,
    bos_token_id=1,
    eos_token_ids=(2,),
    pad_token_id=0,
    num_parameters=1000,
    hidden_size=32,
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return toy_tokenizer(Path(tmp_path_factory.mktemp("tok")))


def test_a_matching_draft_has_no_problems(tokenizer: Tokenizer) -> None:
    draft = dataclasses.replace(TARGET, name="draft", vocab_size=64 + 128, num_parameters=10)
    assert compatibility_problems(TARGET, tokenizer, draft, tokenizer) == []
    check_compatible(TARGET, tokenizer, draft, None)


def test_each_difference_is_named(tokenizer: Tokenizer) -> None:
    draft = dataclasses.replace(
        TARGET,
        name="draft",
        family="gemma3",
        vocab_size=64 + 129,
        bos_token_id=5,
        eos_token_ids=(3, 4),
        pad_token_id=None,  # unknown on one side: not a difference
    )
    problems = compatibility_problems(TARGET, tokenizer, draft, None)
    assert [p.split(" ")[0] for p in problems] == ["architecture", "vocabulary", "BOS", "EOS"]
    assert "differ by 129" in problems[1]
    with pytest.raises(IncompatibleModelsError, match="draft 'draft' cannot serve target"):
        check_compatible(TARGET, tokenizer, draft, None)


def test_token_strings_must_agree_over_the_shared_ids(tokenizer: Tokenizer) -> None:
    class Renumbered:
        """The toy tokenizer's kind and strings, with ids 7 and 8 swapped."""

        kind = tokenizer.kind

        def token_strings(self) -> list[str]:
            strings = list(tokenizer.token_strings())[:50]
            strings[7], strings[8] = strings[8], strings[7]
            return strings

    (problem,) = compatibility_problems(TARGET, tokenizer, TARGET, Renumbered())  # type: ignore[arg-type]
    assert problem.startswith("token 7 differs")
