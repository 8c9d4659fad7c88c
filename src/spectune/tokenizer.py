"""Text <-> tokens, chat templates and incremental detokenization (transformers' tokenizers)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from spectune.cache_dir import derived_path
from spectune.errors import ModelLoadError, PromptError

__all__ = ["IncrementalDecoder", "Tokenizer", "load_tokenizer"]


class Tokenizer:
    """A thin wrapper over a transformers tokenizer with the few verbs spectune uses."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_token_id(self) -> int | None:
        value = self.hf.eos_token_id
        return None if value is None else int(value)

    @property
    def kind(self) -> str:
        """The tokenization algorithm (BPE, Unigram, WordPiece, ...), for pairing checks."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        model = getattr(backend, "model", None)
        return type(model).__name__ if model is not None else type(self.hf).__name__

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        if not text:
            raise PromptError("the prompt is empty")
        return [int(t) for t in self.hf.encode(text, add_special_tokens=True)]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Apply the model's chat template (with the generation prompt) and tokenize."""
        if not messages or not any(m.get("content") for m in messages):
            raise PromptError("the chat has no message content")
        if not self.has_chat_template:
            raise PromptError("this model's tokenizer has no chat template; pass a plain prompt")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return [int(t) for t in self.hf.encode(text, add_special_tokens=False)]

    def decode(self, tokens: list[int]) -> str:
        return str(self.hf.decode(tokens, skip_special_tokens=True))

    def token_strings(self) -> list[str]:
        """Token string per id, for draft/target compatibility checks."""
        vocab = self.hf.get_vocab()
        strings = [""] * (max(vocab.values()) + 1 if vocab else 0)
        for text, idx in vocab.items():
            strings[idx] = text
        return strings


class IncrementalDecoder:
    """Turns a growing list of token ids into newly completed text, for streaming.

    Decodes the whole generated sequence each time and yields the new suffix, holding it
    back while it ends in an incomplete UTF-8 sequence (the replacement character).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""

    def push(self, tokens: list[int]) -> str:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens)
        if text.endswith("\ufffd"):
            return ""
        new = text[len(self.text) :] if text.startswith(self.text) else ""
        self.text = text
        return new


def load_tokenizer(path: Path) -> Tokenizer:
    """Tokenizer of a GGUF file (built from its metadata) or of an HF folder."""
    from transformers import AutoTokenizer

    # transformers logs a long notice for every GGUF it converts; it is not actionable here.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        if path.is_file():
            # Converting a GGUF vocabulary takes seconds; the converted tokenizer is cached.
            cached = derived_path(path, "tokenizer")
            if (cached / "tokenizer.json").is_file():
                return Tokenizer(AutoTokenizer.from_pretrained(str(cached)))
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            try:
                # Save aside then rename, so a concurrent reader never sees half a folder.
                tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
                hf.save_pretrained(str(tmp))
                os.replace(tmp, cached)
            except OSError:
                pass  # a read-only cache (or a concurrent writer) only costs speed
        else:
            hf = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # transformers raises a zoo of types for bad folders
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {exc}") from exc
    return Tokenizer(hf)
