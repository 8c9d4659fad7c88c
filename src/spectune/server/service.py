"""What the routes call: a request body becomes checked token ids, sampling parameters and a
K policy (``prepare``), then a stream of text deltas from the scheduler (``stream``).

Every check happens in ``prepare``, before the request takes a place in the queue, so a
bad request is refused with a 4xx and never reaches the engine.

Shutdown (driven by ``spectune.server.shutdown``): ``drain`` makes ``prepare`` refuse new
requests with a 503 while those in flight (``in_flight``) go on; ``cancel_all`` then ends
whatever is left with a 503 error (``ShuttingDown``) that the routes answer in OpenAI's
shape, a streamed response in-band.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from spectune.control.base import FixedK, KPolicy
from spectune.control.crossover import verify_curve_of
from spectune.control.registry import make_policy
from spectune.errors import SpectuneError
from spectune.models.base import LanguageModel
from spectune.models.tokenizer import Tokenizer
from spectune.monitor.hub import Monitor
from spectune.sampling import SamplingParams
from spectune.server.engines import RequestDrafters
from spectune.server.errors import APIError
from spectune.server.limits import ApiKeys, Limits
from spectune.server.metrics import ServerMetrics
from spectune.server.output import Delta, TextAssembler
from spectune.server.scheduler import (
    AsyncSink,
    QueueFull,
    RequestPolicies,
    Scheduler,
    StepEngine,
    Submission,
    Update,
)
from spectune.server.schemas import ChatCompletionRequest, CompletionRequest, SpectuneOptions

__all__ = ["Prepared", "ServedModel", "Service", "ShuttingDown"]

DISCONNECT_POLL_SECONDS = 0.25
GREEDY_BELOW = 1e-5  # temperatures under this decode greedily


class ShuttingDown(APIError):
    """The server is shutting down: a request refused while it drains, or cancelled after
    the drain bound (503; OpenAI's clients treat it as retryable)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, type="server_error", code="server_shutting_down")


@dataclass(frozen=True)
class ServedModel:
    name: str  # the ``model`` clients send
    model: LanguageModel
    tokenizer: Tokenizer
    drafter: str | None = None  # the served drafter's name; None: no speculation
    aliases: tuple[str, ...] = ()  # other names accepted in ``model`` (e.g. "default")


@dataclass(frozen=True)
class Prepared:
    prompt: tuple[int, ...]
    params: SamplingParams
    policy: KPolicy | None  # None: the engine's default
    stream: bool
    include_usage: bool
    tenant: str | None = None  # the API key's holder (None: no keys)


class Service:
    """The served model, its scheduler, limits and metrics.

    ``keys``: the API keys accepted and their tenants (None: open). ``drafters``: the
    per-request drafter factory the engine was built with where it drafts from a history of
    earlier outputs (``RequestDrafters``: each request's tenant reaches it). ``spec_usage``:
    responses' usage carries the request's speculation counts.
    """

    def __init__(
        self,
        served: ServedModel,
        engine: StepEngine,
        *,
        limits: Limits | None = None,
        keys: ApiKeys | None = None,
        metrics: ServerMetrics | None = None,
        context_limit: int | None = None,
        policies: RequestPolicies | None = None,
        drafters: RequestDrafters | None = None,
        monitor: Monitor | None = None,
        spec_usage: bool = True,
    ) -> None:
        self.served = served
        self.limits = limits or Limits()
        self.keys = keys
        self.drafters = drafters
        self.spec_usage = spec_usage
        self.metrics = metrics or ServerMetrics()
        # Speculation statistics (``spectune_spec_decode_*``) on the same registry.
        self.monitor = monitor or Monitor(registry=self.metrics.registry)
        self.scheduler = Scheduler(
            engine,
            max_requests=self.limits.max_requests,
            on_step=self.metrics.observe_step,
            policies=policies,
            tenants=drafters,
        )
        self.context_limit = context_limit or served.model.info.max_context
        self.cost_curve = verify_curve_of(served.model)  # the cost policy's prior
        self.draining = False  # shutting down: new requests get a 503
        # The requests being served, by id: their sinks, so that shutdown can end each one
        # from the event loop even while the scheduler thread is inside a long step.
        self._sinks: dict[str, AsyncSink] = {}

    # -- shutting down --------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet ended (by their last token, an error, their client
        going away or ``cancel_all``)."""
        return len(self._sinks)

    def drain(self) -> None:
        """Refuse new requests from now on (503); those in flight go on."""
        self.draining = True

    def cancel_all(self, reason: str) -> int:
        """End every request in flight with a ``ShuttingDown`` error saying ``reason``; how
        many. Each stream raises it at its next read (updates already queued come first, so
        a request whose last step has arrived still finishes), and its row is freed at the
        scheduler's next step."""
        cut = list(self._sinks.items())  # each leaves ``_sinks`` when its stream ends
        for request_id, sink in cut:
            sink.fail(ShuttingDown(reason))
            self.scheduler.cancel(request_id)
        return len(cut)

    # -- checking a request ---------------------------------------------------------------

    def prepare(
        self, body: CompletionRequest | ChatCompletionRequest, tenant: str | None = None
    ) -> Prepared:
        if self.draining:
            raise ShuttingDown(
                "the server is shutting down and takes no new requests; retry on another "
                "replica or once it has restarted"
            )
        if body.model != self.served.name and body.model not in self.served.aliases:
            raise APIError(
                404,
                f"model '{body.model}' is not served here; this server serves '{self.served.name}'",
                param="model",
                code="model_not_found",
            )
        prompt = self._prompt_tokens(body)
        if len(prompt) > self.limits.max_prompt_tokens:
            raise APIError(
                400,
                f"the prompt has {len(prompt)} tokens; this server accepts at most "
                f"{self.limits.max_prompt_tokens}",
                param="prompt" if isinstance(body, CompletionRequest) else "messages",
                code="prompt_too_long",
            )
        temperature = 1.0 if body.temperature is None else float(body.temperature)
        if temperature < GREEDY_BELOW:
            # The limit of sampling as the temperature falls is the argmax; a temperature
            # this small would only overflow the scaled logits (vLLM draws the same line).
            temperature = 0.0
        params = SamplingParams(
            temperature=temperature,
            top_k=body.top_k or 0,
            top_p=1.0 if body.top_p is None else float(body.top_p),
            max_tokens=self._max_tokens(body, len(prompt)),
            stop=body.stop_strings(),
            seed=body.seed,
        )
        return Prepared(
            prompt=tuple(prompt),
            params=params,
            policy=self._policy(body.spectune, params),
            stream=body.stream,
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            tenant=tenant,
        )

    def _prompt_tokens(self, body: CompletionRequest | ChatCompletionRequest) -> list[int]:
        tokenizer = self.served.tokenizer
        vocab = self.served.model.info.vocab_size
        # Clients' text never becomes special tokens, unless a raw prompt opts in.
        allow_special = body.spectune is not None and body.spectune.allow_special_tokens
        try:
            if isinstance(body, ChatCompletionRequest):
                if allow_special:
                    raise APIError(
                        400,
                        "allow_special_tokens applies to /v1/completions text prompts; chat "
                        "messages are always tokenized as plain text",
                        param="spectune.allow_special_tokens",
                        code="unsupported_option",
                    )
                if not tokenizer.has_chat_template:
                    raise APIError(
                        400,
                        "this model has no chat template: send the prompt as plain text to "
                        "/v1/completions, or start spectune serve with --chat-template "
                        "FILE|NAME",
                        param="messages",
                        code="no_chat_template",
                    )
                messages = [{"role": m.role, "content": m.text()} for m in body.messages]
                return tokenizer.encode_chat(messages)
            if isinstance(body.prompt, str):
                return tokenizer.encode(body.prompt, allow_special_tokens=allow_special)
            if isinstance(body.prompt[0], str):
                return tokenizer.encode(str(body.prompt[0]), allow_special_tokens=allow_special)
        except (SpectuneError, APIError):
            raise
        except Exception as exc:  # tokenizers and templates raise many types on odd input
            raise APIError(
                400, f"cannot tokenize the prompt: {exc}", code="invalid_prompt"
            ) from exc
        tokens = [int(t) for t in body.prompt]
        if any(not 0 <= t < vocab for t in tokens):
            raise APIError(
                400,
                f"prompt token ids must be in [0, {vocab})",
                param="prompt",
                code="invalid_prompt",
            )
        return tokens

    def _max_tokens(
        self, body: CompletionRequest | ChatCompletionRequest, prompt_tokens: int
    ) -> int:
        asked = body.max_tokens
        if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
            asked = body.max_completion_tokens
        room = self.context_limit - prompt_tokens
        if asked is None:
            if room < 1:
                raise APIError(
                    400,
                    f"the prompt has {prompt_tokens} tokens and fills the context of "
                    f"{self.context_limit}",
                    code="context_length_exceeded",
                )
            return min(self.limits.default_max_tokens, room)
        if asked > self.limits.max_tokens:
            raise APIError(
                400,
                f"max_tokens is {asked}; this server allows at most {self.limits.max_tokens}",
                param="max_tokens",
                code="max_tokens_too_large",
            )
        if asked > room:
            raise APIError(
                400,
                f"the context holds {self.context_limit} tokens, but the prompt has "
                f"{prompt_tokens} and max_tokens asks for {asked}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return asked

    def _policy(self, options: SpectuneOptions | None, params: SamplingParams) -> KPolicy | None:
        """The request's own K policy, or None for the server's default.

        ``off``, ``drafter: "none"`` or ``k: 0`` turn speculation off; a ``policy`` is built
        by name (``k`` is then its fixed or initial K); ``k`` alone means a fixed K.
        """
        if options is None:
            return None
        served = self.served.drafter
        if options.drafter not in (None, "none", served):
            names = ", ".join(repr(n) for n in ("none", served) if n)
            raise APIError(
                400,
                f"drafter '{options.drafter}' is not served here (choose from {names})",
                param="spectune.drafter",
                code="unknown_drafter",
            )
        policy: KPolicy | None
        if options.off or options.drafter == "none" or served is None or options.k == 0:
            policy = FixedK(0)
        elif options.policy is not None:
            config = (
                {}
                if options.k is None
                else {"k" if options.policy == "fixed" else "initial_k": options.k}
            )
            policy = make_policy(options.policy, config, params=params, cost_curve=self.cost_curve)
        elif options.k is not None:
            policy = FixedK(options.k)
        else:
            policy = None
        if policy is not None and not self.scheduler.accepts_policy:
            raise APIError(
                400,
                "this server's batch engine does not take per-request speculation settings",
                param="spectune",
                code="unsupported_option",
            )
        return policy

    # -- running a request ----------------------------------------------------------------

    async def stream(
        self,
        prepared: Prepared,
        assembler: TextAssembler,
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> AsyncGenerator[Delta, None]:
        """Submit the request and yield its text deltas until it finishes.

        Leaving early (the client went away, the consumer stopped) cancels the request in
        the engine, which frees its cache row; a stop string found here does the same.
        ``is_disconnected`` is polled while waiting: for a response that is not streamed
        it is the only way to notice a client that went away, and for a streamed one it
        covers the wait for the first token (Starlette watches the connection only once
        the response has started; before, a request queued behind a full batch would keep
        its place, then a row, long after its client left).
        """
        request_id = uuid.uuid4().hex
        sink = AsyncSink(asyncio.get_running_loop())
        submission = Submission(
            request_id, prepared.prompt, prepared.params, sink, prepared.policy, prepared.tenant
        )
        try:
            self.scheduler.submit(submission)
        except QueueFull as exc:
            raise APIError(
                429,
                f"the server is busy: {exc}; retry later",
                type="rate_limit_error",
                code="too_many_requests",
            ) from exc
        # The trace's request info: ``spectune tune`` reads the temperature, ``spectune
        # advise --traces`` replays the prompt (its token ids) at it.
        info = {
            "temperature": prepared.params.temperature,
            "prompt_tokens": len(prepared.prompt),
            "prompt": list(prepared.prompt),
        }
        watch = self.monitor.request(policy=prepared.policy, request_id=request_id, info=info)
        self._sinks[request_id] = sink
        engine_done = False  # the engine finished the request and freed its row itself
        client_gone = False
        cut = False  # cancelled by the shutdown
        finished = False  # the last delta (with its finish reason) was handed out
        client = None if is_disconnected is None else _ClientWatch(is_disconnected)
        try:
            while True:
                update = await self._next(sink, client)
                if update is None:
                    client_gone = True
                    break
                watch.observe(update.record)
                delta = assembler.push(update.record)
                engine_done = update.record.finish_reason is not None
                finished = delta.finish_reason is not None
                yield delta
                if finished:
                    break  # a stop string may end the text before the engine ends it
        except (GeneratorExit, asyncio.CancelledError):
            # Closed before the end: the client went away (after the end: just cleanup).
            client_gone = not finished
            raise
        except ShuttingDown:
            cut = True
            raise
        finally:
            del self._sinks[request_id]
            # Every request's trace ends with its ``end`` event, however it ended.
            watch.finish(cancelled=client_gone or cut)
            if not engine_done:
                self.scheduler.cancel(request_id)
            if client_gone:
                self.metrics.cancelled.inc()

    @staticmethod
    async def _next(sink: AsyncSink, client: _ClientWatch | None) -> Update | None:
        """The request's next update, or None once its client has gone.

        The client is checked every ``DISCONNECT_POLL_SECONDS`` whether or not updates
        arrive meanwhile: a fast engine delivers one every few milliseconds, and a check
        made only while waiting would never run.
        """
        if client is None:
            return await sink.next()
        while True:
            if await client.gone():
                return None
            try:
                return await asyncio.wait_for(sink.next(), client.until_next_check())
            except TimeoutError:
                continue


class _ClientWatch:
    """Asks ``is_disconnected`` at most once per ``DISCONNECT_POLL_SECONDS``."""

    def __init__(self, is_disconnected: Callable[[], Awaitable[bool]]) -> None:
        self.is_disconnected = is_disconnected
        self.next_check = time.monotonic() + DISCONNECT_POLL_SECONDS

    def until_next_check(self) -> float:
        return max(self.next_check - time.monotonic(), 0.0)

    async def gone(self) -> bool:
        if time.monotonic() < self.next_check:
            return False
        self.next_check = time.monotonic() + DISCONNECT_POLL_SECONDS
        return await self.is_disconnected()
