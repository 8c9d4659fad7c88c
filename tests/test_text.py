"""The text layer (``spectune.decode.text``): incremental UTF-8, stop strings, a held-back
partial stop, and the CLI's ``stream_text`` over a real engine."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from spectune.cli.generate import decode, summary
from spectune.control.base import FixedK
from spectune.control.replay import fake_record
from spectune.decode.engine import SpeculativeEngine
from spectune.decode.text import StopStrings, TextPiece, TextStream, stream_text
from spectune.drafters import ModelDrafter
from spectune.models.llama import LlamaLM
from spectune.models.tokenizer import Tokenizer
from spectune.records import StepRecord
from spectune.sampling import SamplingParams
from spectune.server.output import TextAssembler
from spectune.server.testing import toy_tokenizer


class _Bytes:
    """A byte-level tokenizer: token id = one UTF-8 byte."""

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(tokens).decode("utf-8", errors="replace")


BYTES = Tokenizer(_Bytes())


def ids(text: str) -> list[int]:
    return list(text.encode())


def test_incomplete_utf8_is_held_back_until_complete() -> None:
    stream = TextStream(BYTES)
    e_acute = ids("é")  # two bytes
    assert stream.push([*ids("a"), e_acute[0]], final=False) == TextPiece("", False, 0)
    assert stream.push([e_acute[1]], final=False).text == "aé"
    # The final step flushes an incomplete sequence as it decodes.
    assert stream.push([0xC3], final=True).text == "\ufffd"


def test_a_stop_split_across_steps_is_never_shown() -> None:
    stream = TextStream(BYTES, ["END"])
    assert stream.push(ids("abEN"), final=False) == TextPiece("ab", False, 0)
    piece = stream.push(ids("Dxyz"), final=False)
    assert piece == TextPiece("", True, 3)  # "xyz" came after the token completing "END"
    assert stream.tokens == ids("abEND")


def test_a_partial_stop_that_does_not_complete_is_released() -> None:
    stream = TextStream(BYTES, ["END", "xy"])
    assert stream.push(ids("abE"), final=False).text == "ab"
    assert stream.push(ids("Fx"), final=False).text == "EF"  # "x" may begin "xy"
    assert stream.push(ids("z"), final=False).text == "xz"
    assert stream.push(ids("EN"), final=True) == TextPiece("EN", False, 0)  # flushed at the end


def test_the_earliest_stop_wins_and_partial_lengths() -> None:
    stops = StopStrings(BYTES, ["cd", "abc"])
    assert stops.find("xabcd") == 1
    assert stops.check(ids("xabcd")) == 4  # "xabc" already holds "abc"
    assert stops.partial_length("xab") == 2 and stops.partial_length("xc") == 1
    assert stops.partial_length("xyz") == 0
    assert TextStream(BYTES, ["abc"]).push(ids("xabcd"), final=True) == TextPiece("x", True, 1)


@pytest.mark.parametrize("stop_at", [None, 5])
def test_stream_text_yields_the_whole_text(
    toy_target: LlamaLM, toy_draft: LlamaLM, tmp_path: Path, stop_at: int | None
) -> None:
    """The streamed pieces add up to the decoded output (cut at the stop string, and the
    last step's text included), and the engine stops at the step completing the stop."""
    tokenizer = toy_tokenizer(tmp_path / "tok")
    engine = SpeculativeEngine(toy_target, ModelDrafter(toy_draft))
    prompt = [1, 30, 31, 32]
    plain = engine.run(prompt, SamplingParams(max_tokens=24))
    full = tokenizer.decode(plain.tokens)
    stops: tuple[str, ...] = ()
    if stop_at is not None:  # a stop string made of two words of the greedy output
        words = full.split()
        stops = (f"{words[stop_at]} {words[stop_at + 1]}",)
    params = SamplingParams(max_tokens=24, stop=stops)
    chunks = list(stream_text(engine, tokenizer, prompt, params))
    text = "".join(c.text for c in chunks)
    if stop_at is None:
        assert text == full and chunks[-1].record.finish_reason == "length"
    else:
        assert text == full[: full.index(stops[0])]
        assert chunks[-1].record.finish_reason == "stop"
        assert stops[0] not in text


def test_the_cli_reports_the_prefill(toy_target: LlamaLM, tmp_path: Path) -> None:
    """``generate --json``'s ``prefill_seconds``: the CLI builds its ``Generation`` from
    the streamed records, and used to leave the prefill at 0."""
    tokenizer = toy_tokenizer(tmp_path / "tok")
    engine = SpeculativeEngine(toy_target)
    prompt = list(range(1, 41))  # a 39-token prefill
    start = time.perf_counter()
    gen, _ = decode(engine, tokenizer, prompt, SamplingParams(max_tokens=4), FixedK(0), False)
    elapsed = time.perf_counter() - start
    assert 0.0 < gen.prefill_time < elapsed - gen.decode_time
    assert summary(gen)["prefill_seconds"] == round(gen.prefill_time, 4)


def test_server_usage_counts_only_the_output() -> None:
    """The server's assembler: text from ``TextStream``, usage from ``SpecCounts``; tokens
    past a stop leave ``completion_tokens``, a tree counts its depth in ``drafted``."""
    assembler = TextAssembler(BYTES, ("END",))

    def step(text: str, accepted: int, drafted: int | None = None) -> StepRecord:
        record = fake_record(4, accepted, num_draft_tokens=drafted, emitted=len(ids(text)))
        return dataclasses.replace(record, emitted=tuple(ids(text)))

    first = assembler.push(dataclasses.replace(step("abcE", 3, drafted=9), tree_depth=4))
    assert (first.text, first.finish_reason) == ("abc", None)
    second = assembler.push(step("NDx", 2))
    assert (second.text, second.finish_reason) == ("", "stop")
    usage = assembler.usage()
    assert (usage.steps, usage.drafted, usage.accepted) == (2, 8, 5)  # 4 (tree depth) + 4
    assert usage.completion_tokens == len(ids("abcEND")) == len(assembler.tokens)
    assert usage.acceptance_rate == 5 / 8
    assert usage.mean_accepted_length == 6 / 2
    assert usage.fallbacks == 0 and usage.fallback_reasons == ()
