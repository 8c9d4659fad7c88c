"""Safe defaults: request limits, the body-size guard and the optional API keys.

Every limit is answered with a 4xx in OpenAI's error shape before any model work is
done: 413 for a body over ``max_body_bytes`` (checked on the declared length and on the
bytes actually received), 400 for too many prompt tokens or too large ``max_tokens``,
429 when ``max_requests`` are already running or waiting, 401 for a missing or wrong key.
Each key belongs to a tenant (``ApiKeys``); the tenant scopes what a request drafts from.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spectune.errors import InvalidParameterError
from spectune.server.errors import APIError

__all__ = ["DEFAULT_TENANT", "ApiKeys", "BodySizeLimit", "Limits"]

DEFAULT_TENANT = "default"  # the holder of ``--api-key``


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


@dataclass(frozen=True)
class ApiKeys:
    """The keys a server accepts, each naming its tenant (keys may share a tenant, e.g.
    an old and a new key while one is rotated)."""

    tenants: Mapping[str, str]  # key -> tenant

    def __post_init__(self) -> None:
        if not self.tenants:
            raise InvalidParameterError("no API keys given")
        for key, tenant in self.tenants.items():
            if not key or any(c.isspace() for c in key) or not tenant.strip():
                raise InvalidParameterError(
                    "an API key must be non-empty without spaces, and name a tenant"
                )

    @classmethod
    def single(cls, key: str, tenant: str = DEFAULT_TENANT) -> ApiKeys:
        return cls({key: tenant})

    @classmethod
    def read(cls, path: Path, extra: Mapping[str, str] | None = None) -> ApiKeys:
        """Keys from ``path``, one ``KEY TENANT`` per line (blank lines and ``#`` comments
        are skipped), plus ``extra``; a bad line is an ``InvalidParameterError`` naming it."""
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidParameterError(f"cannot read API keys from {path}: {exc}") from exc
        tenants = dict(extra or {})
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            words = text.split(None, 1)
            where = f"{path}, line {number}"
            if len(words) < 2:
                raise InvalidParameterError(f"{where}: expected 'KEY TENANT', got one word")
            key, tenant = words
            if key in tenants:
                raise InvalidParameterError(f"{where}: this key is given twice")
            tenants[key] = tenant.strip()
        if not tenants:
            raise InvalidParameterError(f"{path} holds no API keys")
        return cls(tenants)

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant of ``Authorization: Bearer <key>``; a 401 for a missing or wrong key."""
        scheme, _, token = (authorization or "").partition(" ")
        sent = token.strip().encode()
        found: str | None = None
        # compare_digest against every key, none skipped: the time taken reveals neither
        # how much of a key matched nor which key it was.
        for key, tenant in self.tenants.items():
            if hmac.compare_digest(sent, key.encode()):
                found = tenant
        if scheme.lower() != "bearer" or found is None:
            raise APIError(
                401,
                "missing or incorrect API key (send 'Authorization: Bearer <key>')",
                code="invalid_api_key",
            )
        return found


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
