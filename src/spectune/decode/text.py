"""Text around the token engine: stop strings and streamed, incrementally decoded text.

The CLI decodes through ``stream_text``; the server assembles its text in
``spectune.server.output.TextAssembler`` (which also holds back a partial stop string).
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

__all__ = ["StopStrings", "TextChunk", "stream_text"]


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


@dataclass(frozen=True)
class TextChunk:
    record: StepRecord
    text: str  # newly completed text (may be empty while a UTF-8 sequence is incomplete)


def stream_text(
    engine: SpeculativeEngine,
    tokenizer: Tokenizer,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    *,
    policy: KPolicy | None = None,
    generator: torch.Generator | None = None,
) -> Iterator[TextChunk]:
    stop = StopStrings(tokenizer, params.stop) if params.stop else None
    decoder = IncrementalDecoder(tokenizer)
    for record in engine.generate(
        prompt_tokens, params, policy=policy, generator=generator, stop=stop
    ):
        text = decoder.push(list(record.emitted))
        if record.finish_reason is not None:
            # Flush what was held back, and cut at the stop string if one ended the text.
            full = tokenizer.decode(decoder.tokens)
            if stop is not None and (cut := stop.find(full)) is not None:
                full = full[:cut]
            text = full[len(decoder.text) :] if full.startswith(decoder.text) else ""
        yield TextChunk(record, text)
