"""Request and response bodies, as in OpenAI's API (pydantic models, strict types).

Fields spectune does not implement are accepted only at their neutral value (so common
clients that send them keep working) and refused with a 400 otherwise; unknown fields
are ignored, as OpenAI-compatible servers do. spectune's own options travel in the
``spectune`` extension object.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
)

from spectune.control.registry import POLICIES
from spectune.records import MAX_K

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ErrorBody",
    "ErrorResponse",
    "SpecUsage",
    "SpectuneOptions",
    "StreamOptions",
    "Usage",
]


def _json_integer(value: object) -> object:
    """JSON Schema counts 2.0 as an integer; strings and booleans are never numbers here."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool | str):
        raise ValueError("Input should be a valid integer")
    return value


# An integer as JSON Schema defines it (2 and 2.0, never "2" or true).
Integer = Annotated[int, BeforeValidator(_json_integer)]
# StrictFloat takes JSON integers too, but never strings or booleans.
Number = StrictFloat
StopField = Annotated[StrictStr, Field(min_length=1, max_length=256)]
MAX_SEED = 2**63 - 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SpectuneOptions(_Body):
    """spectune's per-request speculation settings (an OpenAI extension object)."""

    drafter: StrictStr | None = Field(
        default=None, description="the served drafter's name, or 'none' for no speculation"
    )
    policy: Literal[POLICIES] | None = Field(  # type: ignore[valid-type]
        default=None, description="K policy for this request (default: the server's)"
    )
    k: Annotated[Integer, Field(ge=0, le=MAX_K)] | None = Field(
        default=None,
        description="fixed K without a policy, else the policy's (initial) K; 0 = no speculation",
    )
    off: StrictBool = Field(default=False, description="decode without speculation")
    allow_special_tokens: StrictBool = Field(
        default=False,
        description="completions only: parse special-token text (e.g. '<|im_end|>') in a "
        "text prompt into special tokens; chat messages are always plain text",
    )


class StreamOptions(_Body):
    include_usage: StrictBool = False


class _Sampling(_Body):
    model: StrictStr
    max_tokens: Annotated[Integer, Field(ge=1)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[Integer, Field(ge=0)] | None = Field(
        default=None, description="extension (as vLLM): sample among the k likeliest tokens"
    )
    stop: StopField | Annotated[list[StopField], Field(max_length=4)] | None = None
    seed: Annotated[Integer, Field(ge=0, le=MAX_SEED)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = Field(default=1, description="only 1 is supported")
    presence_penalty: Annotated[Number, Field(ge=0, le=0)] = Field(
        default=0, description="only 0 is supported"
    )
    frequency_penalty: Annotated[Number, Field(ge=0, le=0)] = Field(
        default=0, description="only 0 is supported"
    )
    user: StrictStr | None = None
    spectune: SpectuneOptions | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: a text prompt, or its token ids."""

    prompt: (
        Annotated[StrictStr, Field(min_length=1)]
        | Annotated[list[Integer], Field(min_length=1)]
        | Annotated[
            list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1, max_length=1)
        ]
    )
    echo: Literal[False] = Field(default=False, description="not supported")
    logprobs: None = Field(default=None, description="not supported")
    best_of: Literal[1] | None = Field(default=None, description="only 1 is supported")
    suffix: None = Field(default=None, description="not supported")


class TextPart(_Body):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``: messages, through the model's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[Integer, Field(ge=1)] | None = None
    logprobs: Literal[False] | None = Field(default=None, description="not supported")


class Usage(BaseModel):
    """OpenAI's usage."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecUsage(Usage):
    """OpenAI's usage, plus this request's own speculation statistics (``serve
    --no-spec-usage`` leaves them out; with a shared history they are a side channel)."""

    drafted: int = Field(
        description="draft positions tested (a chain: its tokens; a token tree: its depth)"
    )
    accepted: int = Field(description="draft tokens the target accepted")
    acceptance_rate: float = Field(
        description="accepted / drafted positions (0 when nothing was drafted)"
    )
    mean_accepted_length: float = Field(description="tokens emitted per target step")
    steps: int = Field(description="target verification steps")
    fallbacks: int = Field(description="steps run without speculation because of a fallback")
    fallback_reasons: list[str]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorBody
