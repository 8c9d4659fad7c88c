"""Settings of a corpus and of a distillation run as plain data: ``spectune corpus`` and
``spectune distill`` build their parsers from them without loading torch
(``spectune.distill.corpus`` and ``spectune.distill.data`` act on them)."""

from __future__ import annotations

from dataclasses import dataclass

from spectune.errors import InvalidParameterError

__all__ = ["PRECISIONS", "PROMPT_MIXES", "CorpusSettings"]

PROMPT_MIXES = (1, 2)
PRECISIONS = ("fp32", "bf16")  # what the teacher pass and training run in


@dataclass(frozen=True)
class CorpusSettings:
    """How much of what: the knobs of one corpus (part of every shard's metadata)."""

    items_per_shard: int = 96
    max_answer_tokens: int = 256
    max_document_tokens: int = 200
    max_turn_tokens: int = 64
    max_batch: int = 24
    seed: int = 0
    # Which prompts (module docstring): 1 = shards 0-56, 58 of the committed corpus; 2 adds
    # closed-book questions and translations into English, and drops Chinese / Japanese.
    prompt_mix: int = 2

    def __post_init__(self) -> None:
        if self.prompt_mix not in PROMPT_MIXES:
            raise InvalidParameterError(
                f"prompt mix must be one of {', '.join(map(str, PROMPT_MIXES))}, "
                f"got {self.prompt_mix}"
            )
