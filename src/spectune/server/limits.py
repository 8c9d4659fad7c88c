"""Safe defaults: request limits, the body-size guard and the optional API key.

Every limit is answered with a 4xx in OpenAI's error shape before any model work is
done: 413 for a body over ``max_body_bytes`` (checked on the declared length and on the
bytes actually received), 400 for too many prompt tokens or too large ``max_tokens``,
429 when ``max_requests`` are already running or waiting, 401 for a missing or wrong key.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spectune.server.errors import APIError

__all__ = ["BodySizeLimit", "Limits", "check_api_key"]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20  # 1 MiB: far above any prompt the token limit allows
    max_prompt_tokens: int = 4096
    max_tokens: int = 1024  # most tokens one request may ask for
    default_max_tokens: int = 256  # when the request does not say
    max_requests: int = 64  # running plus waiting; more are refused with 429

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompt_tokens", "max_tokens", "max_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 1 <= self.default_max_tokens <= self.max_tokens:
            raise ValueError("default_max_tokens must be in [1, max_tokens]")


def check_api_key(expected: str | None, authorization: str | None) -> None:
    """Raise a 401 unless ``authorization`` is ``Bearer <expected>`` (no key: all pass)."""
    if expected is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    # compare_digest: the time taken does not reveal how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode(), expected.encode()
    ):
        raise APIError(
            401,
            "missing or incorrect API key (send 'Authorization: Bearer <key>')",
            code="invalid_api_key",
        )


class BodySizeLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with a 413.

    The declared ``Content-Length`` is checked first; a body sent without one (chunked)
    is counted as it arrives and cut off at the limit.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._refuse(send, 400, "invalid Content-Length header")
                    return
                if declared > self.limit:
                    await self._refuse(send, 413, self._message())
                    return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge(self._message())
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, 413, self._message())

    def _message(self) -> str:
        return f"the request body is larger than the server's limit of {self.limit} bytes"

    @staticmethod
    async def _refuse(send: Send, status: int, message: str) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "request_too_large" if status == 413 else "invalid_request",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(HTTPException):
    """Raised inside the app's receive when the streamed body passes the limit. An
    ``HTTPException``, so FastAPI's body reader lets it through to the error handler."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)
