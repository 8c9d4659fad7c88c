"""From step records to response text and usage, in OpenAI's vocabulary.

The text comes from the shared text layer (``spectune.decode.text.TextStream``: UTF-8,
stop strings, a held-back partial stop); the usage from the shared counters
(``spectune.records.SpecCounts``). The batch engine knows nothing about text, so a stop
string is found here, after the step that completed it; the caller then cancels the
request in the scheduler, and the tokens past the stop leave the counts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from spectune.decode.text import TextStream
from spectune.models.tokenizer import Tokenizer
from spectune.records import CountsReport, SpecCounts, StepRecord

__all__ = ["Delta", "SpeculationUsage", "TextAssembler", "openai_finish_reason"]


def openai_finish_reason(reason: str) -> str:
    """spectune's reasons ("eos" | "stop" | "length") in OpenAI's vocabulary."""
    return "length" if reason == "length" else "stop"


@dataclass(frozen=True)
class Delta:
    text: str  # new text to send (may be empty)
    finish_reason: str | None  # OpenAI's reason once the request is done


@dataclass(frozen=True)
class SpeculationUsage(CountsReport):
    """Speculation statistics of one request: its counters (rates are derived there) and
    the reasons it fell back, under the names of the usage object."""

    counts: SpecCounts  # a copy: the assembler's own counters go on counting
    fallback_reasons: tuple[str, ...]  # each reason once, in the order first seen

    @property
    def steps(self) -> int:
        return self.counts.steps

    @property
    def drafted(self) -> int:
        """Draft positions tested (a tree counts its depth, not its nodes): the usage
        object's ``drafted`` has always been the acceptance rate's denominator."""
        return self.counts.positions

    @property
    def completion_tokens(self) -> int:
        """Output tokens (after a stop string's cut)."""
        return self.counts.emitted

    @property
    def fallbacks(self) -> int:
        """Steps that ran without (or with cut-short) speculation."""
        return self.counts.fallback_steps


class TextAssembler:
    """Accumulates one request's steps into text deltas (``spectune.decode.text``) and
    usage (``SpecCounts``)."""

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...]) -> None:
        self.text = TextStream(tokenizer, stops)
        self.counts = SpecCounts()
        self.finish_reason: str | None = None
        self._reasons: list[str] = []

    @property
    def tokens(self) -> list[int]:
        return self.text.tokens

    def push(self, record: StepRecord) -> Delta:
        """Take one step; ``finish_reason`` is set when the request is done (by the engine,
        or here by a stop string: the caller must then cancel it in the engine)."""
        self.counts.add(record)
        if record.fallback is not None and record.fallback not in self._reasons:
            self._reasons.append(record.fallback)
        piece = self.text.push(record.emitted, final=record.finish_reason is not None)
        self.counts.drop_emitted(piece.dropped)  # tokens past a stop are not output
        if piece.stopped:
            finish: str | None = "stop"
        elif record.finish_reason is not None:
            finish = openai_finish_reason(record.finish_reason)
        else:
            finish = None
        self.finish_reason = finish
        return Delta(piece.text, finish)

    def usage(self) -> SpeculationUsage:
        return SpeculationUsage(copy.deepcopy(self.counts), tuple(self._reasons))
