"""The one text layer around the token engine, shared by the CLI and the server.

The engines know nothing about text. ``TextStream`` turns one request's emitted tokens
into text deltas, step by step:

- incremental UTF-8: text that ends in an incomplete UTF-8 sequence is held back until
  the sequence completes (``spectune.models.tokenizer.IncrementalDecoder``);
- stop strings: the text is cut where the earliest stop string begins, and the tokens
  after the one that completed it are dropped (``StopStrings``);
- a partial stop: while the request runs, text that could still grow into a stop string
  is held back until it cannot, so a stop string never reaches the reader, even one split
  across steps (what vLLM and OpenAI do).

``SamplingParams.stop`` is read here only. The CLI (``stream_text``) also hands the
``StopStrings`` to the engine as its ``StopCondition``, so a single request stops the
step its stop string completes; the server's batch engine decodes on, and the server
cancels the request once ``TextStream`` reports the stop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from spectune.control.base import KPolicy
from spectune.decode.engine import SpeculativeEngine
from spectune.models.tokenizer import IncrementalDecoder, Tokenizer
from spectune.records import StepRecord
from spectune.sampling import SamplingParams

__all__ = ["StopStrings", "TextChunk", "TextPiece", "TextStream", "stream_text"]


class StopStrings:
    """Stops when the decoded output contains any of ``stops``; keeps the tokens up to and
    including the one that completed it (the text itself is cut at the stop string)."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)

    def find(self, text: str) -> int | None:
        """Index in ``text`` where the earliest stop string starts, or None."""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def check(self, output: Sequence[int]) -> int | None:
        if self.find(self.tokenizer.decode(list(output))) is None:
            return None
        keep = len(output)
        while keep > 1 and self.find(self.tokenizer.decode(list(output[: keep - 1]))) is not None:
            keep -= 1
        return keep

    def partial_length(self, text: str) -> int:
        """Length of the longest end of ``text`` that begins some stop string (0: none)."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


@dataclass(frozen=True)
class TextPiece:
    """What one step added to a request's text."""

    text: str  # new text to show (may be empty: held back, or nothing new)
    stopped: bool  # a stop string ended the text at this step
    dropped: int  # emitted tokens cut after the one that completed the stop string


class TextStream:
    """One request's output text, pushed a step's tokens at a time (module docstring)."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = StopStrings(tokenizer, stops) if stops else None
        self.decoder = IncrementalDecoder(tokenizer)
        self.sent = 0  # characters of the text already handed out

    @property
    def tokens(self) -> list[int]:
        """The output tokens so far (after a stop: up to the one that completed it)."""
        return self.decoder.tokens

    def push(self, tokens: Sequence[int], *, final: bool) -> TextPiece:
        """Take one step's emitted tokens; ``final``: the engine ended the request with them
        (everything held back is then released, up to any stop string)."""
        self.decoder.push(list(tokens))
        # The final flush decodes everything, a trailing incomplete UTF-8 sequence included.
        text = self.tokenizer.decode(self.decoder.tokens) if final else self.decoder.text
        cut = self.stop.find(text) if self.stop is not None else None
        dropped = 0
        if cut is not None:
            assert self.stop is not None
            keep = self.stop.check(self.decoder.tokens)
            if keep is not None:
                dropped = len(self.decoder.tokens) - keep
                del self.decoder.tokens[keep:]
            text = text[:cut]
        elif not final and self.stop is not None:
            text = text[: len(text) - self.stop.partial_length(text)]
        new = text[self.sent :] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return TextPiece(new, cut is not None, dropped)


@dataclass(frozen=True)
class TextChunk:
    record: StepRecord
    text: str  # newly completed text (may be empty while text is held back)


def stream_text(
    engine: SpeculativeEngine,
    tokenizer: Tokenizer,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    *,
    policy: KPolicy | None = None,
    generator: torch.Generator | None = None,
) -> Iterator[TextChunk]:
    """Decode one request through ``engine`` and ``TextStream``: each step's record and the
    text it completed. The engine stops at the step that completes a stop string."""
    stream = TextStream(tokenizer, params.stop)
    for record in engine.generate(
        prompt_tokens, params, policy=policy, generator=generator, stop=stream.stop
    ):
        piece = stream.push(record.emitted, final=record.finish_reason is not None)
        yield TextChunk(record, piece.text)
