"""The HTTP endpoints: OpenAI's completions, chat completions and models, plus health and
Prometheus metrics. Responses are shaped here; all the work is in ``Service``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from spectune.errors import SpectuneError
from spectune.server.errors import ERROR_RESPONSES, APIError
from spectune.server.output import Delta, TextAssembler
from spectune.server.schemas import ChatCompletionRequest, CompletionRequest, SpecUsage, Usage
from spectune.server.service import Prepared, Service

__all__ = ["build_router"]


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def _authorized(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """A 401 unless the key is one of the server's (no keys: all pass); the key's tenant
    goes into ``request.state.tenant`` (None without keys)."""
    keys = _service(request).keys
    request.state.tenant = None if keys is None else keys.tenant_of(authorization)


def usage_of(prepared: Prepared, assembler: TextAssembler, speculation: bool) -> dict[str, Any]:
    """OpenAI's usage block, plus this request's own speculation counts if ``speculation``."""
    stats = assembler.usage()
    plain = Usage(
        prompt_tokens=len(prepared.prompt),
        completion_tokens=stats.completion_tokens,
        total_tokens=len(prepared.prompt) + stats.completion_tokens,
    )
    if not speculation:
        return plain.model_dump()
    return SpecUsage(
        **plain.model_dump(),
        drafted=stats.drafted,
        accepted=stats.accepted,
        acceptance_rate=round(stats.acceptance_rate, 4),
        mean_accepted_length=round(stats.mean_accepted_length, 4),
        steps=stats.steps,
        fallbacks=stats.fallbacks,
        fallback_reasons=list(stats.fallback_reasons),
    ).model_dump()


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class _Shape:
    """How one endpoint words its responses (completion vs chat)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
            return {**self._envelope("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return {**self._envelope("text_completion"), "choices": [choice], "usage": usage}

    def chunk(self, delta: Delta, first: bool) -> dict[str, Any]:
        if self.chat:
            content: dict[str, Any] = {"content": delta.text}
            if first:
                content = {"role": "assistant", **content}
            choice: dict[str, Any] = {
                "index": 0,
                "delta": content,
                "finish_reason": delta.finish_reason,
                "logprobs": None,
            }
            return {**self._envelope("chat.completion.chunk"), "choices": [choice]}
        choice = {
            "index": 0,
            "text": delta.text,
            "finish_reason": delta.finish_reason,
            "logprobs": None,
        }
        return {**self._envelope("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._envelope(obj), "choices": [], "usage": usage}


class _EventStream(StreamingResponse):
    """A streamed response that closes its events, and the request's deltas under them,
    however it ends. Starlette leaves the body iterator as it was when the client went
    away: suspended, or never started if the client left before the first byte (while
    waiting for its first token). Until the garbage collector finalised it, the request
    would keep its row in the batch."""

    def __init__(
        self, events: AsyncGenerator[bytes, None], deltas: AsyncGenerator[Delta, None]
    ) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.events = events
        self.deltas = deltas

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):  # also when the response was cancelled
                await self.events.aclose()
                await self.deltas.aclose()  # a no-op once the events closed it


async def _respond(
    request: Request, body: CompletionRequest | ChatCompletionRequest, endpoint: str
) -> Response:
    service = _service(request)
    metrics = service.metrics
    start = time.perf_counter()
    status = 500
    streaming = False  # a started stream counts its own status when it ends
    try:
        prepared = service.prepare(body, tenant=request.state.tenant)
        assembler = TextAssembler(service.served.tokenizer, prepared.params.stop)
        shape = _Shape(isinstance(body, ChatCompletionRequest), service.served.name)
        if prepared.stream:
            deltas = service.stream(prepared, assembler, request.is_disconnected)
            # Wait for the first step before answering 200, so a request the engine
            # refuses still gets a proper error status.
            try:
                first = await anext(deltas)
            except StopAsyncIteration:
                status = 499  # the client went away before its first token
                return Response(status_code=499)
            metrics.first_token.observe(time.perf_counter() - start)
            status, streaming = 200, True
            events = _events(service, prepared, assembler, shape, first, deltas, endpoint, start)
            return _EventStream(events, deltas)
        text: list[str] = []
        finish: str | None = None
        async with aclosing(service.stream(prepared, assembler, request.is_disconnected)) as stream:
            async for delta in stream:
                if not text:
                    metrics.first_token.observe(time.perf_counter() - start)
                text.append(delta.text)
                finish = delta.finish_reason
        if finish is None:
            status = 499  # the client went away; nobody reads this response
            return Response(status_code=499)
        metrics.observe_request(len(prepared.prompt), assembler.usage())
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        status = 200
        return JSONResponse(
            shape.full("".join(text), finish, usage_of(prepared, assembler, service.spec_usage))
        )
    except APIError as exc:
        status = exc.status
        raise
    except SpectuneError:
        status = 400
        raise
    finally:
        if not streaming:
            metrics.requests.labels(endpoint, str(status)).inc()


async def _events(
    service: Service,
    prepared: Prepared,
    assembler: TextAssembler,
    shape: _Shape,
    first: Delta,
    deltas: AsyncGenerator[Delta, None],
    endpoint: str,
    start: float,
) -> AsyncGenerator[bytes, None]:
    """The response's server-sent events: chunks, the usage chunk if asked, ``[DONE]``.

    An error after the headers (a failed step, the shutdown's cancel) is one in-band event
    in OpenAI's error shape, then ``[DONE]``, as vLLM ends a failed stream.
    """
    metrics = service.metrics
    status = "499"  # unless it ends normally, the client went away
    try:
        yield _sse(shape.chunk(first, first=True))
        delta = first
        while delta.finish_reason is None:
            try:
                delta = await anext(deltas)
            except StopAsyncIteration:
                return  # the client went away (seen by the service's poll)
            except Exception as exc:  # headers are sent: report in-band
                error = _in_band(exc)
                status = str(error.status)
                yield _sse(
                    {
                        "error": {
                            "message": error.message,
                            "type": error.type,
                            "param": error.param,
                            "code": error.code,
                        }
                    }
                )
                yield _sse("[DONE]")
                return
            yield _sse(shape.chunk(delta, first=False))
        if prepared.include_usage:
            yield _sse(shape.usage_chunk(usage_of(prepared, assembler, service.spec_usage)))
        yield _sse("[DONE]")
        status = "200"
        metrics.observe_request(len(prepared.prompt), assembler.usage())
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
    finally:
        await deltas.aclose()
        metrics.requests.labels(endpoint, status).inc()


def _in_band(exc: Exception) -> APIError:
    """What a stream says of an error raised after its headers went out."""
    if isinstance(exc, APIError):
        return exc
    message = str(exc) if isinstance(exc, SpectuneError) else "internal server error"
    return APIError(500, message, type="server_error")


def build_router() -> APIRouter:
    router = APIRouter()
    authorized = [Depends(_authorized)]

    @router.post(
        "/v1/completions",
        dependencies=authorized,
        responses=ERROR_RESPONSES,
        summary="Complete a text prompt",
    )
    async def completions(request: Request, body: CompletionRequest) -> Response:
        return await _respond(request, body, "completions")

    @router.post(
        "/v1/chat/completions",
        dependencies=authorized,
        responses=ERROR_RESPONSES,
        summary="Answer a chat through the model's chat template",
    )
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        return await _respond(request, body, "chat")

    @router.get("/v1/models", dependencies=authorized, responses=ERROR_RESPONSES)
    async def models(request: Request) -> dict[str, Any]:
        service = _service(request)
        info = service.served.model.info
        return {
            "object": "list",
            "data": [
                {
                    "id": service.served.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "spectune",
                    "max_model_len": service.context_limit,
                    "family": info.family,
                    "drafter": service.served.drafter,
                }
            ],
        }

    @router.get(
        "/health",
        responses={503: {"description": "shutting down, or the scheduler has stopped"}},
    )
    async def health(request: Request) -> JSONResponse:
        service = _service(request)
        scheduler = service.scheduler
        state = "ok" if scheduler.alive else "stopped"
        if service.draining:
            state = "draining"  # a load balancer sends new requests elsewhere
        body = {"status": state, "running": scheduler.running, "waiting": scheduler.waiting}
        return JSONResponse(body, status_code=200 if state == "ok" else 503)

    @router.get("/metrics", dependencies=authorized, responses=ERROR_RESPONSES)
    async def metrics(request: Request) -> Response:
        service = _service(request)
        service.metrics.running.set(service.scheduler.running)
        service.metrics.waiting.set(service.scheduler.waiting)
        drafters = service.drafters
        if drafters is not None:
            service.metrics.history_tokens.set(drafters.num_tokens)
            service.metrics.history_tenants.set(drafters.num_stores)
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
