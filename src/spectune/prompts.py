"""Evaluation prompt sets: the shipped one and any JSONL a user brings in the same shape.

One JSON object per line, either a chat::

    {"id": "translation-03", "category": "translation", "split": "test",
     "messages": [{"role": "user", "content": "..."}]}

where ``messages`` alternates roles (system, user, assistant) freely but must end with a
user turn (the model answers it), or a plain prompt ``{"prompt": "..."}``: text the model
continues as it stands, with no chat template (as ``/v1/completions`` and ``spectune
generate PROMPT`` take it). ``category``, ``id`` and ``split`` are optional: a missing
category is ``default``, a missing id ``<category>-<line>``, a missing split ``"test"``;
other keys are ignored. Categories are free text, so users' own sets load as well as the
shipped one, whose first six
categories mirror Spec-Bench (multi-turn chat, translation, summarization, question answering,
math reasoning, retrieval-augmented answering); a seventh, ``code`` (writing, fixing and
explaining Python, JavaScript, SQL and bash), tests the rule that code is accepted less
often than chat. The shipped set marks 5 prompts per category
``"dev"`` (for tuning) and keeps the rest ``"test"`` (held out, for reported numbers).

A chat is encoded with the model's chat template, or the one ``--chat-template`` names
(``prompt_encoding``); on a model without one, the commands that measure on a prompt set
run its chats as plain prompts (the messages' contents joined by blank lines) and say so.

Every line is validated before anything is returned; a bad line raises ``PromptError`` naming
``file:line`` and the reason, so a benchmark never dies halfway through a user's file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from spectune.errors import PromptError
from spectune.models.chat_templates import PLAIN, ChatTemplate
from spectune.models.tokenizer import Tokenizer, check_text

__all__ = [
    "CATEGORIES",
    "PLAIN_CHATS_NOTE",
    "EvalPrompt",
    "PromptEncoding",
    "default_prompts_path",
    "load_prompts",
    "prompt_encoding",
]

CATEGORIES: tuple[str, ...] = (
    "multi_turn_chat",
    "translation",
    "summarization",
    "question_answering",
    "math_reasoning",
    "retrieval_qa",
    "code",
)

_ROLES = frozenset({"system", "user", "assistant"})
DEFAULT_CATEGORY = "default"
PLAIN_CHATS_NOTE = (
    "this model has no chat template: the prompt set's chats run as plain prompts (each "
    "chat's messages as one text); --chat-template FILE|NAME applies a template"
)


@dataclass(frozen=True)
class EvalPrompt:
    """One evaluation prompt: a chat that ends with the user turn the model must answer,
    or (``plain``) a text the model continues, held as one user message in ``messages``
    for consumers that send every prompt as a chat."""

    id: str
    category: str
    messages: tuple[dict[str, str], ...]
    split: str = "test"
    plain: bool = False  # the ``prompt`` form: no chat template

    def tokens(self, tokenizer: Tokenizer) -> list[int]:
        """Prompt token ids: a chat through the tokenizer's chat template (with the
        generation prompt), a plain prompt as a raw prompt (special-token text stays text)."""
        if self.plain:
            return tokenizer.encode(self.messages[0]["content"])
        return tokenizer.encode_chat([dict(m) for m in self.messages])


@dataclass(frozen=True)
class PromptEncoding:
    """How a prompt set's chats become tokens: the tokenizer to call ``EvalPrompt.tokens``
    with, the format records name (``plain`` or ``chat:<template>``), and the line that
    says a model without a chat template runs them as plain prompts (None otherwise)."""

    tokenizer: Tokenizer
    format: str
    note: str | None = None


def prompt_encoding(
    tokenizer: Tokenizer, template: ChatTemplate | None, prompts: Iterable[EvalPrompt] = ()
) -> PromptEncoding:
    """``template`` (``--chat-template``) where given, else the model's own; a model
    without one runs the chats as plain prompts, with the note that says so. A set of
    plain prompts only is ``plain`` whatever the template."""
    has_chats = any(not p.plain for p in prompts)
    note = None
    if template is not None:
        tokenizer = tokenizer.with_chat_template(template)
    elif not tokenizer.has_chat_template:
        tokenizer = tokenizer.with_chat_template(PLAIN)
        note = PLAIN_CHATS_NOTE if has_chats else None
    chosen = tokenizer.chat_template
    assert chosen is not None  # chosen above or the model's own
    return PromptEncoding(tokenizer, chosen.label if has_chats else "plain", note)


def default_prompts_path() -> Path:
    """The shipped evaluation set (inside the installed package)."""
    return Path(str(resources.files("spectune") / "assets" / "prompts" / "eval.jsonl"))


def load_prompts(
    path: str | Path | None = None,
    *,
    categories: Iterable[str] | None = None,
    split: str | None = None,
    limit_per_category: int | None = None,
) -> list[EvalPrompt]:
    """Read and validate a prompt JSONL (the shipped set when ``path`` is None).

    Filters apply after validation, in file order: ``categories`` keeps only those (an
    unknown name is an error, since it is almost always a typo), ``split`` keeps one split,
    ``limit_per_category`` keeps the first N of each category.
    """
    source = default_prompts_path() if path is None else Path(path)
    prompts = _read(source)

    if categories is not None:
        wanted = tuple(categories)
        present = {p.category for p in prompts}
        unknown = [c for c in wanted if c not in present]
        if unknown:
            raise PromptError(
                f"{source}: no prompts in categories {unknown}; present: {sorted(present)}"
            )
        prompts = [p for p in prompts if p.category in wanted]
    if split is not None:
        prompts = [p for p in prompts if p.split == split]
    if limit_per_category is not None:
        if limit_per_category < 1:
            raise PromptError(f"limit_per_category must be >= 1, got {limit_per_category}")
        taken: dict[str, int] = {}
        kept = []
        for p in prompts:
            if taken.get(p.category, 0) < limit_per_category:
                taken[p.category] = taken.get(p.category, 0) + 1
                kept.append(p)
        prompts = kept
    if not prompts:
        raise PromptError(f"{source}: no prompts left after filtering")
    return prompts


def _read(source: Path) -> list[EvalPrompt]:
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptError(f"prompt file not found: {source}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"cannot read prompt file {source}: {exc}") from exc

    prompts: list[EvalPrompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue  # blank lines (often a trailing one) are not records
        where = f"{source}:{number}"
        prompt = _parse_line(line, where, number)
        if prompt.id in seen:
            raise PromptError(
                f"{where}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})"
            )
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptError(f"prompt file is empty: {source}")
    return prompts


def _parse_line(line: str, where: str, number: int) -> EvalPrompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise PromptError(f"{where}: expected a JSON object, got {type(record).__name__}")

    category = record.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise PromptError(f"{where}: 'category' must be a non-empty string")

    if "messages" in record and "prompt" in record:
        raise PromptError(f"{where}: give 'messages' (a chat) or 'prompt' (plain text), not both")
    if "messages" in record:
        messages = _parse_messages(record["messages"], where)
    elif "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptError(f"{where}: 'prompt' must be a non-empty string")
        check_text(prompt, f"{where}: 'prompt'")
        messages = ({"role": "user", "content": prompt},)
    else:
        raise PromptError(f"{where}: needs 'messages' (a chat) or 'prompt' (plain text)")

    prompt_id = record.get("id", f"{category}-{number}")
    if not isinstance(prompt_id, str) or not prompt_id:
        raise PromptError(f"{where}: 'id' must be a non-empty string")
    split = record.get("split", "test")
    if not isinstance(split, str) or not split:
        raise PromptError(f"{where}: 'split' must be a non-empty string")
    return EvalPrompt(
        id=prompt_id,
        category=category,
        messages=messages,
        split=split,
        plain="messages" not in record,
    )


def _parse_messages(value: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise PromptError(f"{where}: 'messages' must be a non-empty list")
    messages: list[dict[str, str]] = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise PromptError(f"{where}: message {index} is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise PromptError(
                f"{where}: message {index} has role {role!r}; expected one of {sorted(_ROLES)}"
            )
        if not isinstance(content, str) or not content.strip():
            raise PromptError(f"{where}: message {index} needs non-empty string 'content'")
        check_text(content, f"{where}: message {index}'s content")
        messages.append({"role": role, "content": content})
    if messages[-1]["role"] != "user":
        raise PromptError(f"{where}: the last message must be from the user (the model answers it)")
    return tuple(messages)
