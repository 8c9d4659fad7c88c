"""Where distillation text comes from: prompt files (chats to continue), reference replies
(chats to teacher-force) and plain text, in the shapes of the common prompt sets (chat
``messages``, GSM8K ``question``/``answer``, Alpaca ``instruction``/``instances``, ``text``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.errors import InvalidParameterError, ModelLoadError

__all__ = ["CorpusItem", "read_json_lines", "read_prompt_files", "read_reference_chats"]


def _read_text(path: Path) -> str:
    """A text file's contents; one that cannot be read, or is not UTF-8 text (a binary
    file), raises ``ModelLoadError`` with one line."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


def read_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """JSON-lines files: (line number, value) for every non-empty line; a line that is not
    JSON raises ``InvalidParameterError`` (``file:line: not JSON (...)``)."""
    lines = _read_text(path).splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidParameterError(f"{path}:{number}: not JSON ({exc})") from exc


@dataclass(frozen=True)
class CorpusItem:
    """One source of training text: a chat to continue, or text to teacher-force."""

    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs
    text: str = ""
    reply: str = ""  # a reference assistant reply to teacher-force instead of generating

    def cache_key(self) -> str:
        # Without a reply the key is the historical repr, so existing caches stay valid.
        if self.reply:
            return repr(self)
        return f"CorpusItem(messages={self.messages!r}, text={self.text!r})"


def _item_from_record(record: dict[str, object]) -> CorpusItem | None:
    """Accepts the shapes of the common prompt sets: chat messages, GSM8K, Alpaca, plain."""
    messages = record.get("messages")
    if isinstance(messages, list) and messages:
        pairs = tuple(
            (str(m.get("role", "user")), str(m.get("content", "")))
            for m in messages
            if isinstance(m, dict)
        )
        # A trailing assistant turn is the reference answer: the target writes its own.
        while pairs and pairs[-1][0] == "assistant":
            pairs = pairs[:-1]
        return CorpusItem(messages=pairs) if pairs else None
    for key in ("question", "prompt"):
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return CorpusItem(messages=(("user", value),))
    instruction = record.get("instruction")
    if isinstance(instruction, str) and instruction.strip():
        extra = ""
        instances = record.get("instances")
        if isinstance(instances, list) and instances and isinstance(instances[0], dict):
            extra = str(instances[0].get("input") or "")
        elif isinstance(record.get("input"), str):
            extra = str(record["input"])
        content = instruction if not extra.strip() else f"{instruction}\n\n{extra}"
        return CorpusItem(messages=(("user", content),))
    text = record.get("text")
    if isinstance(text, str) and text.strip():
        return CorpusItem(text=text)
    return None


_LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese")


def _task_variant(record: dict[str, object], rng: random.Random) -> CorpusItem | None:
    """Rewrap a question-style record as one of the evaluation tasks the raw corpus lacks.

    The GSM8K and Alpaca sets are math and instructions only; a draft trained on them alone
    has never seen the target translate, summarize or answer from a given context. The
    variants reuse the record's own text, so no outside data enters the corpus.
    """
    question = str(record.get("question") or record.get("instruction") or "").strip()
    answer = str(record.get("answer") or "")
    instances = record.get("instances")
    if not answer and isinstance(instances, list) and instances and isinstance(instances[0], dict):
        answer = str(instances[0].get("output") or "")
    answer = re.sub(r"<<[^>]*>>", "", answer).replace("####", "Answer:").strip()
    if not question:
        return None
    roll = rng.random()
    if roll < 0.4 or not answer:
        prompt = question
    elif roll < 0.6:
        prompt = f"Translate the following text into {rng.choice(_LANGUAGES)}:\n\n{question}"
    elif roll < 0.8:
        prompt = f"Summarize the following in one or two sentences.\n\n{question}\n{answer}"
    else:
        prompt = (
            "Answer the question using only the context below.\n\n"
            f"Context:\n{answer}\n\nQuestion: {question}"
        )
    return CorpusItem(messages=(("user", prompt),))


def _reference_reply(record: dict[str, object]) -> CorpusItem | None:
    """A chat with its reference reply (GSM8K answer, Alpaca output, a final assistant turn)."""
    item = _item_from_record(record)
    if item is None or not item.messages:
        return None
    reply = ""
    messages = record.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        if messages[-1].get("role") == "assistant":
            reply = str(messages[-1].get("content") or "")
    if isinstance(record.get("answer"), str):
        answer = re.sub(r"<<[^>]*>>", "", str(record["answer"]))
        reply = re.sub(r"\n#### *(.*)$", r"\nThe answer is \1.", answer.strip())
    instances = record.get("instances")
    if isinstance(instances, list) and instances and isinstance(instances[0], dict):
        reply = str(instances[0].get("output") or "")
    if isinstance(record.get("output"), str):
        reply = str(record["output"])
    return CorpusItem(messages=item.messages, reply=reply.strip()) if reply.strip() else None


def read_reference_chats(paths: Sequence[Path], *, seed: int = 0) -> list[CorpusItem]:
    """The JSONL records that carry a reference reply, as chats to teacher-force (shuffled).

    Scoring given text costs one batched forward, several times cheaper per token than
    generating; EAGLE's heads are trained on fixed chat data the same way.
    """
    items: list[CorpusItem] = []
    for path in paths:
        if path.suffix != ".jsonl" or not path.is_file():
            continue
        for line in _read_text(path).splitlines():
            try:
                record = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                continue
            item = _reference_reply(record) if isinstance(record, dict) else None
            if item is not None:
                items.append(item)
    random.Random(seed).shuffle(items)
    return items


def read_prompt_files(
    paths: Sequence[Path], *, task_mix: bool = False, seed: int = 0
) -> list[CorpusItem]:
    """JSONL files give one chat per line; other files are plain text, one document each
    (paragraphs separated by blank lines become separate documents).

    ``task_mix`` rewraps 60% of question-style records as translation, summarization or
    context-answering tasks (see ``_task_variant``). Items come back shuffled with ``seed``
    so that any prefix of the corpus mixes all files.
    """
    rng = random.Random(seed)
    items: list[CorpusItem] = []
    for path in paths:
        if not path.is_file():
            raise InvalidParameterError(f"corpus file not found: {path}")
        if path.suffix == ".jsonl":
            for _, record in read_json_lines(path):
                if not isinstance(record, dict):
                    continue
                item = _item_from_record(record)
                if task_mix and item is not None and "messages" not in record:
                    item = _task_variant(record, rng) or item
                if item is not None:
                    items.append(item)
        else:
            for part in _read_text(path).split("\n\n"):
                if part.strip():
                    items.append(CorpusItem(text=part.strip()))
    if not items:
        raise InvalidParameterError("the corpus files hold no usable prompt or text")
    rng.shuffle(items)
    return items
