"""Chat templates other than the model's own: the built-in ones ``--chat-template NAME``
picks and a Jinja file ``--chat-template FILE`` names.

A template is rendered as transformers renders a model's own (``messages``,
``add_generation_prompt``, the tokenizer's special tokens by name such as ``bos_token``)
and tokenized by ``Tokenizer.encode_chat``, so user text never becomes special tokens
whichever template applies. ``plain`` is no template: the messages' contents, joined by
blank lines, tokenized as a raw prompt is (the form a base model without a chat template
was trained on).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from spectune.errors import InvalidParameterError

__all__ = [
    "BUILTIN_TEMPLATES",
    "PLAIN",
    "ChatTemplate",
    "plain_text",
    "resolve_chat_template",
]

# Names the NAME form of --chat-template takes, with the Jinja source of each (``plain``:
# none). None of them trims or rewrites message text.
BUILTIN_TEMPLATES: dict[str, str | None] = {
    # Qwen, SmolLM2, many instruct fine-tunes: <|im_start|>role\n...<|im_end|>\n
    "chatml": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{{ message['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    # Llama 3 instruct: a header per turn, <|eot_id|> after each.
    "llama3": (
        "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
        "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
        "{% endif %}"
    ),
    # Gemma 3 instruct: user and model turns; a system message opens the first user turn.
    "gemma": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
        "{% set prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
        "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
        "{% for message in turns %}<start_of_turn>"
        "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
        "{% if loop.first %}{{ prefix }}{% endif %}{{ message['content'] }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "plain": None,
}


@dataclass(frozen=True)
class ChatTemplate:
    """How a chat becomes prompt tokens.

    ``name``: a built-in's name, the template file's path, or ``model`` (the model's own);
    ``source``: the Jinja text (None: the model's own where ``name`` is ``model``, else
    ``plain``, which joins the messages' contents with blank lines).
    """

    name: str
    source: str | None

    @property
    def plain(self) -> bool:
        return self.source is None and self.name != MODEL

    @property
    def label(self) -> str:
        """How records name the prompt format: ``plain`` or ``chat:<name>``."""
        return "plain" if self.plain else f"chat:{self.name}"


MODEL = "model"
PLAIN = ChatTemplate("plain", None)
OWN = ChatTemplate(MODEL, None)  # the model's own template, as its tokenizer holds it


def plain_text(messages: list[dict[str, str]]) -> str:
    """A chat as ``plain`` renders it: the contents, in order, joined by blank lines."""
    return "\n\n".join(m["content"] for m in messages if m.get("content"))


def resolve_chat_template(value: str) -> ChatTemplate:
    """``--chat-template FILE|NAME``: a built-in by name, else a Jinja file, checked by
    rendering a one-message chat (a one-line error for a missing, unreadable or broken
    file, before any model loads)."""
    names = ", ".join(sorted(BUILTIN_TEMPLATES))
    if value in BUILTIN_TEMPLATES:
        source = BUILTIN_TEMPLATES[value]
        return PLAIN if source is None else ChatTemplate(value, source)
    path = Path(value).expanduser()
    if not path.is_file():
        raise InvalidParameterError(
            f"--chat-template {value}: no such file, and not a built-in template ({names})"
        )
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"--chat-template {value}: cannot read it ({exc})") from None
    if not source.strip():
        raise InvalidParameterError(f"--chat-template {value}: the file is empty")
    problem = _render_problem(source)
    if problem is not None:
        raise InvalidParameterError(f"--chat-template {value}: {problem}")
    return ChatTemplate(str(path), source)


def _render_problem(source: str) -> str | None:
    """Why ``source`` does not render a one-message chat as transformers would, or None."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    # transformers' settings; its {% generation %} tag (assistant masks) renders its body.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    source = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", source)
    try:
        text = env.from_string(source).render(
            messages=[{"role": "user", "content": "Hello"}],
            add_generation_prompt=True,
            bos_token="",
            eos_token="",
        )
    except jinja2.TemplateSyntaxError as exc:
        return f"not a valid Jinja template (line {exc.lineno}: {exc.message})"
    except Exception as exc:  # a template may raise anything while rendering
        return f"the template fails on a one-message chat ({type(exc).__name__}: {exc})"
    if "Hello" not in text:
        return "the template leaves the messages' content out"
    return None
