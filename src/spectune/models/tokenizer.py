"""Text <-> tokens, chat templates and incremental detokenization (transformers' tokenizers).

Special-token policy: text a user supplies never becomes a special token. A raw prompt is
tokenized with special-token parsing off (``<|im_end|>`` in it is plain text) unless the
caller opts in with ``allow_special_tokens=True`` (the CLI's ``--allow-special-tokens``,
the server's ``spectune.allow_special_tokens``). A chat is rendered by the model's template
with a placeholder in every user-supplied field (message content, names); the template's
own text is split at its special tokens (``<|im_start|>``, ``<|im_end|>``, BOS ...), and
each run of ordinary text between them, template and user text together, is tokenized with
parsing off. Without special-token text in the messages this gives exactly the ids of the
plain template rendering (tested over the shipped prompt set), since that is how a tokenizer
treats the text between its special tokens anyway; with it, the forged markers become the
ordinary tokens of their characters.

The template is the model's own unless one is chosen (``with_chat_template``: a built-in, a
Jinja file, or ``plain``, spectune.models.chat_templates); a chosen template goes through
the same path. A model without a template encodes no chat until one is chosen.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spectune.errors import ModelLoadError, PromptError
from spectune.models.cache_dir import derived_path
from spectune.models.chat_templates import OWN, ChatTemplate, plain_text

__all__ = ["NO_CHAT_TEMPLATE", "IncrementalDecoder", "Tokenizer", "check_text", "load_tokenizer"]

NO_CHAT_TEMPLATE = (
    "this model has no chat template: pass a plain prompt, or --chat-template FILE|NAME"
)


class Tokenizer:
    """A thin wrapper over a transformers tokenizer with the few verbs spectune uses."""

    def __init__(self, hf_tokenizer: Any, chat_template: ChatTemplate | None = None) -> None:
        self.hf = hf_tokenizer
        self._chosen = chat_template  # None: the model's own

    def with_chat_template(self, template: ChatTemplate | None) -> Tokenizer:
        """This tokenizer, encoding chats with ``template`` (None: the model's own)."""
        return Tokenizer(self.hf, template)

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
    def chat_template(self) -> ChatTemplate | None:
        """The template ``encode_chat`` applies: the chosen one, else the model's own
        (``chat_templates.OWN``), else None."""
        if self._chosen is not None:
            return self._chosen
        return OWN if getattr(self.hf, "chat_template", None) else None

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def encode(self, text: str, *, allow_special_tokens: bool = False) -> list[int]:
        """A raw prompt's ids (with the tokenizer's BOS, if it adds one).

        Special-token text in ``text`` stays plain text unless ``allow_special_tokens``.
        """
        if not text:
            raise PromptError("the prompt is empty")
        check_text(text, "the prompt")
        ids = self.hf.encode(
            text, add_special_tokens=True, split_special_tokens=not allow_special_tokens
        )
        return [int(t) for t in ids]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Apply the chat template (with the generation prompt) and tokenize.

        Only the template's own markers become special tokens; every message field but
        ``role`` is user text (see the module docstring). Roles are checked, not escaped:
        templates branch on them. ``plain`` encodes the contents as a raw prompt.
        """
        if not messages or not any(m.get("content") for m in messages):
            raise PromptError("the chat has no message content")
        template = self.chat_template
        if template is None:
            raise PromptError(NO_CHAT_TEMPLATE)
        if template.plain:
            text = plain_text(messages)
            self._plain_ids(text)  # refuses text this vocabulary turns into special tokens
            return self.encode(text)
        source = template.source  # None: the model's own
        specials = self._special_pattern()
        user_texts: list[str] = []
        templated: list[dict[str, str]] = []  # the messages with placeholders for user text
        slot = f"\ue000{uuid.uuid4().hex}:"  # private-use characters: no template adds them
        for message in messages:
            placeholders = {}
            for key, value in message.items():
                check_text(value, f"message {key}")
                if key == "role":
                    if specials.search(value):
                        raise PromptError(f"the role {value!r} holds special-token text")
                    placeholders[key] = value
                else:
                    placeholders[key] = f"{slot}{len(user_texts)}\ue001"
                    user_texts.append(value)
            templated.append(placeholders)
        rendered = self._render(templated, source)
        pieces = list(_spliced(rendered, slot, user_texts))
        if "".join(text for text, _ in pieces) != self._render(messages, source):
            # The template rewrites user text (trims it, cuts it...), so the placeholders
            # do not show where user text ends up; refuse only what could forge a marker.
            if any(specials.search(text) for text in user_texts):
                raise PromptError(
                    "a message holds special-token text, and this chat template rewrites "
                    "messages, so it cannot be kept as plain text"
                )
            # No user text spells a marker: every one in the rendering is the template's.
            rendering = self._render(messages, source)
            return [int(t) for t in self.hf.encode(rendering, add_special_tokens=False)]
        ids: list[int] = []
        plain: list[str] = []  # ordinary text since the last special token
        for text, trusted in pieces:
            if not trusted:
                plain.append(text)
                continue
            last = 0
            for match in specials.finditer(text):
                plain.append(text[last : match.start()])
                ids += self._plain_ids("".join(plain))
                plain = []
                ids.append(int(self.hf.convert_tokens_to_ids(match.group())))
                last = match.end()
            plain.append(text[last:])
        return ids + self._plain_ids("".join(plain))

    def _render(self, messages: list[dict[str, str]], source: str | None) -> str:
        return str(
            self.hf.apply_chat_template(
                messages, chat_template=source, add_generation_prompt=True, tokenize=False
            )
        )

    def _plain_ids(self, text: str) -> list[int]:
        """Ids of text between special tokens, with special-token parsing off."""
        if not text:
            return []
        ids = [
            int(t)
            for t in self.hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        ]
        # A vocabulary may also hold a special token's text as an ordinary word (word-level
        # models do): parsing off is then not enough, and the text is refused.
        forged = set(ids) & self._special_ids()
        if forged:
            names = ", ".join(sorted(repr(self.hf.convert_ids_to_tokens(t)) for t in forged))
            raise PromptError(f"message text spells special tokens ({names}) in this vocabulary")
        return ids

    def _special_ids(self) -> set[int]:
        """Special tokens' ids, but for the unknown token (ordinary text may map to it)."""
        decoder = getattr(self.hf, "added_tokens_decoder", {})
        added = {int(i) for i, t in decoder.items() if getattr(t, "special", False)}
        return (added | {int(t) for t in self.hf.all_special_ids}) - {self.hf.unk_token_id}

    def _special_pattern(self) -> re.Pattern[str]:
        """Matches any special token's text, longest first (as the tokenizer matches)."""
        tokens = sorted({str(t) for t in self.hf.all_special_tokens} | self._added_specials())
        tokens.sort(key=len, reverse=True)
        return re.compile("|".join(re.escape(t) for t in tokens if t) or "(?!)")

    def _added_specials(self) -> set[str]:
        decoder = getattr(self.hf, "added_tokens_decoder", {})
        return {str(t.content) for t in decoder.values() if getattr(t, "special", False)}

    def decode(self, tokens: list[int]) -> str:
        return str(self.hf.decode(tokens, skip_special_tokens=True))

    def token_strings(self) -> list[str]:
        """Token string per id, for draft/target compatibility checks."""
        vocab = self.hf.get_vocab()
        strings = [""] * (max(vocab.values()) + 1 if vocab else 0)
        for text, idx in vocab.items():
            strings[idx] = text
        return strings


def check_text(text: str, what: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate, e.g. from undecodable bytes
    on a command line), which tokenizers reject with a bare ``TypeError``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptError(
            f"{what} is not valid UTF-8 text (character {exc.start}: {text[exc.start]!r})"
        ) from None


def _spliced(rendered: str, slot: str, user_texts: list[str]) -> Iterator[tuple[str, bool]]:
    """The rendering with each placeholder replaced by its user text, as ``(text,
    trusted)`` pieces: template text is trusted, user text is not."""
    pattern = re.compile(re.escape(slot) + "([0-9]+)\ue001")
    last = 0
    for match in pattern.finditer(rendered):
        yield rendered[last : match.start()], True
        yield user_texts[int(match.group(1))], False
        last = match.end()
    yield rendered[last:], True


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
