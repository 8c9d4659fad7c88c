"""From step records to response text and usage: stop strings, safe streaming, statistics.

The batch engine knows nothing about text, so stop strings are found here, on the
decoded output, after each step; the scheduler is then asked to cancel the request.
Streamed text never shows a stop string, even one split across steps: text that could
still turn into a stop string is held back until it cannot (what vLLM and OpenAI do).
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.decode.text import StopStrings
from spectune.models.tokenizer import IncrementalDecoder, Tokenizer
from spectune.records import StepRecord

__all__ = ["Delta", "SpeculationUsage", "TextAssembler", "openai_finish_reason"]


def openai_finish_reason(reason: str) -> str:
    """spectune's reasons ("eos" | "stop" | "length") in OpenAI's vocabulary."""
    return "length" if reason == "length" else "stop"


@dataclass(frozen=True)
class Delta:
    text: str  # new text to send (may be empty)
    finish_reason: str | None  # OpenAI's reason once the request is done


@dataclass(frozen=True)
class SpeculationUsage:
    """Speculation statistics of one request (counts; rates are derived)."""

    steps: int
    drafted: int  # draft positions tested (a tree counts its depth, not its nodes)
    accepted: int
    completion_tokens: int
    fallbacks: int  # steps that ran without (or with cut-short) speculation, and why
    fallback_reasons: tuple[str, ...]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per step, the target's own token included."""
        return self.completion_tokens / self.steps if self.steps else 0.0


class TextAssembler:
    """Accumulates one request's steps into text deltas and usage."""

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = StopStrings(tokenizer, stops) if stops else None
        self.decoder = IncrementalDecoder(tokenizer)
        self.sent = 0  # characters of the decoded text already sent
        self.finish_reason: str | None = None
        self._steps = self._drafted = self._accepted = self._fallbacks = 0
        self._reasons: list[str] = []

    @property
    def tokens(self) -> list[int]:
        return self.decoder.tokens

    def push(self, record: StepRecord) -> Delta:
        """Take one step; ``finish_reason`` is set when the request is done (by the engine,
        or here by a stop string: the caller must then cancel it in the engine)."""
        self._steps += 1
        self._drafted += record.positions  # draft positions tested (a tree: its depth)
        self._accepted += record.accepted
        if record.fallback is not None:
            self._fallbacks += 1
            if record.fallback not in self._reasons:
                self._reasons.append(record.fallback)
        self.decoder.push(list(record.emitted))
        if record.finish_reason is not None:
            # Flush: the full decode includes text held back as incomplete UTF-8.
            text = self.tokenizer.decode(self.decoder.tokens)
            finish = openai_finish_reason(record.finish_reason)
        else:
            text = self.decoder.text
            finish = None
        cut = self.stop.find(text) if self.stop is not None else None
        if cut is not None:
            # Count only the tokens up to the one that completed the stop string.
            keep = self.stop.check(self.decoder.tokens) if self.stop is not None else None
            if keep is not None:
                del self.decoder.tokens[keep:]
            text, finish = text[:cut], "stop"
        elif finish is None and self.stop is not None:
            text = text[: len(text) - self._stop_prefix_length(text)]
        delta = text[self.sent :] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        self.finish_reason = finish
        return Delta(delta, finish)

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest end of ``text`` that begins some stop string."""
        assert self.stop is not None
        longest = 0
        for stop in self.stop.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def usage(self) -> SpeculationUsage:
        return SpeculationUsage(
            steps=self._steps,
            drafted=self._drafted,
            accepted=self._accepted,
            completion_tokens=len(self.decoder.tokens),
            fallbacks=self._fallbacks,
            fallback_reasons=tuple(self._reasons),
        )
