"""The target-generated corpus: prompts written by the model, answers that are the target's
own, shards that resume after an interrupted run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from spectune.decode.engine import SpeculativeEngine
from spectune.distill import corpus as corpus_module
from spectune.distill.corpus import (
    HELDOUT_MODULUS,
    CorpusSettings,
    SeedData,
    build_shards,
    corpus_stats,
    read_answers,
    split_of,
)
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.tokenizer import Tokenizer
from spectune.sampling import SamplingParams
from spectune.server.testing import toy_tokenizer

SETTINGS = CorpusSettings(
    items_per_shard=16, max_answer_tokens=8, max_document_tokens=8, max_turn_tokens=6, max_batch=4
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return toy_tokenizer(tmp_path_factory.mktemp("toy-tokenizer"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> SeedData:
    folder = tmp_path_factory.mktemp("seeds")
    math = folder / "gsm8k.jsonl"
    math.write_text(
        "".join(
            json.dumps({"question": f"w{i} w{i + 1} w{i + 2}", "answer": "w1"}) + "\n"
            for i in range(8)
        )
    )
    alpaca = folder / "alpaca.jsonl"
    alpaca.write_text(json.dumps({"instruction": "w5 w6", "instances": [{"input": "w7"}]}) + "\n")
    return SeedData.read([math, alpaca])


def _build(
    toy_target: LlamaLM, tokenizer: Tokenizer, seeds: SeedData, folder: Path, shards: range
) -> None:
    build_shards(toy_target, tokenizer, seeds, folder, shards, SETTINGS)


def test_seed_files_give_questions_and_instructions(seeds: SeedData) -> None:
    assert len(seeds.math_questions) == 8
    assert seeds.instructions == ("w5 w6\n\nw7",)


def test_bad_seed_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(InvalidParameterError, match="bad.jsonl:1"):
        SeedData.read([bad])
    with pytest.raises(InvalidParameterError, match="not found"):
        SeedData.read([tmp_path / "missing.jsonl"])


def test_corpus_covers_the_tasks_with_the_targets_own_answers(
    toy_target: LlamaLM, tokenizer: Tokenizer, seeds: SeedData, tmp_path: Path
) -> None:
    _build(toy_target, tokenizer, seeds, tmp_path, range(2))
    answers = list(read_answers(tmp_path))
    categories = {a.category for a in answers}
    # 32 items drawn over 8 tasks: the tasks with the largest shares all appear.
    assert {"multi_turn_chat", "writing", "math_reasoning"} <= categories
    assert len(categories) >= 6
    start, end = (tokenizer.hf.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
    engine = SpeculativeEngine(toy_target, None)
    checked = 0
    for answer in answers:
        assert answer.prompt[-2:] == tuple(tokenizer.hf.encode("<|im_start|> assistant"))
        assert start in answer.prompt and end in answer.prompt
        if answer.temperature == 0.0 and checked < 6:
            # Greedy answers are exactly what the target says alone (the batched runtime
            # may round a near-tie differently; the toy model has none at this length).
            alone = engine.run(
                list(answer.prompt), SamplingParams(max_tokens=len(answer.answer))
            ).tokens
            assert tuple(alone) == answer.answer
            checked += 1
    assert checked > 0
    multi = [a for a in answers if a.category == "multi_turn_chat"]
    # A follow-up answer's prompt holds the first exchange: two user turns.
    assert any(a.prompt.count(tokenizer.hf.convert_tokens_to_ids("user")) == 2 for a in multi)
    stats = corpus_stats(tmp_path)
    assert sum(row["positions"] for row in stats.values()) == sum(len(a.answer) for a in answers)


def test_an_interrupted_run_resumes_at_the_missing_shard(
    toy_target: LlamaLM,
    tokenizer: Tokenizer,
    seeds: SeedData,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference = tmp_path / "reference"
    _build(toy_target, tokenizer, seeds, reference, range(3))

    interrupted = tmp_path / "interrupted"
    real_save = corpus_module._save
    saved: list[Path] = []

    def save_then_die(path: Path, *args: object) -> None:
        if len(saved) == 2:
            path.with_suffix(".tmp").write_bytes(b"half a shard")  # killed mid-write
            raise KeyboardInterrupt
        real_save(path, *args)  # type: ignore[arg-type]
        saved.append(path)

    monkeypatch.setattr(corpus_module, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        _build(toy_target, tokenizer, seeds, interrupted, range(3))
    monkeypatch.undo()
    assert sorted(p.name for p in interrupted.glob("shard-*.safetensors")) == [
        "shard-00000.safetensors",
        "shard-00001.safetensors",
    ]
    first_written = saved[0].stat().st_mtime_ns
    _build(toy_target, tokenizer, seeds, interrupted, range(3))
    assert saved[0].stat().st_mtime_ns == first_written  # done shards are not redone
    # Every shard follows from (seed, index): the resumed corpus equals an uninterrupted one.
    assert list(read_answers(interrupted)) == list(read_answers(reference))


def test_worker_ranges_build_disjoint_shards(
    toy_target: LlamaLM, tokenizer: Tokenizer, seeds: SeedData, tmp_path: Path
) -> None:
    _build(toy_target, tokenizer, seeds, tmp_path, range(1, 4, 2))
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == [
        "shard-00001.safetensors",
        "shard-00003.safetensors",
    ]


def test_held_out_split_is_fixed_by_id() -> None:
    ids = [f"s{s:05d}-{i:03d}/chat" for s in range(40) for i in range(100)]
    held = [i for i in ids if split_of(i) == "heldout"]
    # 4,000 ids at 1/50: 80 expected; outside [45, 125] has probability < 1e-5 (binomial).
    assert 45 <= len(held) <= 125
    assert HELDOUT_MODULUS == 50


def test_missing_corpus_folder_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="not found"):
        list(read_answers(tmp_path / "nowhere"))


@pytest.mark.slow  # seconds: the quick loop (-m 'not slow') stays under 3 minutes
def test_prompt_mix_2_adds_closed_book_questions_and_translations_into_english(
    toy_target: LlamaLM,
    tokenizer: Tokenizer,
    seeds: SeedData,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The toy model writes no "?" and seldom ends an answer: take any written line as the
    # question and every answer as finished, so each step of the rounds has its input.
    real_decode, real_question = corpus_module._decode_all, corpus_module._first_question

    def finished(*args: Any) -> list[tuple[list[int], str]]:
        return [(tokens, "eos") for tokens, _ in real_decode(*args)]

    monkeypatch.setattr(corpus_module, "_decode_all", finished)
    monkeypatch.setattr(
        corpus_module, "_first_question", lambda text, asked=False: real_question(text)
    )

    def items(mix: int) -> tuple[list[tuple[str, str]], list[str], set[str]]:
        folder = tmp_path / f"mix{mix}"
        settings = dataclasses.replace(SETTINGS, items_per_shard=24, prompt_mix=mix)
        build_shards(toy_target, tokenizer, seeds, folder, range(3), settings)
        answers = list(read_answers(folder))
        by_id = {a.id: a for a in answers}
        english = []  # (the target's translation, the prompt that translates it back)
        for a in answers:
            if a.id.endswith("-en/translation"):
                first = by_id[a.id.replace("-en/", "/")]
                text = tokenizer.hf.decode(list(first.answer), skip_special_tokens=True).strip()
                english.append((text, tokenizer.hf.decode(list(a.prompt))))
        asked = [a.id.split("/")[0] for a in answers if a.category == "question_answering"]
        written = {a.id.split("/")[0] for a in answers if a.category == "writing"}
        return english, asked, written

    english, asked, written = items(2)
    # The toy tokenizer reads a word glued to a quote or colon as <unk>: compare the inner words.
    inner = [(" ".join(text.split()[1:-1]), prompt) for text, prompt in english]
    assert any(words for words, _ in inner)
    assert all(words in prompt for words, prompt in inner)
    assert any(item in written for item in asked)  # a question written from a document
    english, asked, written = items(1)
    assert not english and not any(item in written for item in asked)


def test_an_unknown_prompt_mix_is_a_one_line_error() -> None:
    with pytest.raises(InvalidParameterError, match="prompt mix"):
        CorpusSettings(prompt_mix=3)


def test_a_closed_book_question_is_a_line_that_asks() -> None:
    written = "Here is a question.\nWhat keeps a plane in the air?\nIt is lift."
    assert corpus_module._first_question(written) == "Here is a question."
    assert corpus_module._first_question(written, asked=True) == "What keeps a plane in the air?"
    assert corpus_module._first_question("Dear Sarah,\nThanks!", asked=True) == ""


def test_a_text_to_translate_is_cut_to_its_leading_sentences() -> None:
    text = "Pi is 3.14 or so. Circles use it! Why? Nobody asks."
    assert corpus_module._leading_sentences(text, 2) == "Pi is 3.14 or so. Circles use it!"
    assert corpus_module._leading_sentences("No full stop", 2) == "No full stop"


@pytest.mark.gpu
def test_a_target_on_cuda_writes_the_corpus_the_cpu_writes(
    toy_target: LlamaLM, tokenizer: Tokenizer, seeds: SeedData, tmp_path: Path
) -> None:
    """``spectune corpus --device cuda``: the same prompts and (sampling stays on the CPU's
    seeded generator, logits come back to the CPU) the same answers, but for float
    rounding at a near-tie: at least 90% of answers identical on the toy target."""
    import copy

    on_gpu = LlamaLM(copy.deepcopy(toy_target.net).to("cuda"), name=toy_target.info.name)
    _build(toy_target, tokenizer, seeds, tmp_path / "cpu", range(2))
    _build(on_gpu, tokenizer, seeds, tmp_path / "cuda", range(2))
    cpu, gpu = list(read_answers(tmp_path / "cpu")), list(read_answers(tmp_path / "cuda"))
    assert [a.prompt for a in cpu] == [a.prompt for a in gpu]
    same = sum(a.answer == b.answer for a, b in zip(cpu, gpu, strict=True))
    assert same >= 0.9 * len(cpu)
