"""``spectune serve``: the OpenAI-compatible HTTP server (see ``spectune.server``).

Binds 127.0.0.1 unless ``--host`` says otherwise; an API key (``--api-key`` or the
``SPECTUNE_API_KEY`` environment variable, or a file of keys and their tenants with
``--api-keys``) is then strongly advised, and its absence on a non-loopback address is
warned about. Suffix and hybrid drafts draw on earlier outputs of the same tenant only
(``--suffix-history-scope``, docs/serving.md "Multi-tenant serving").
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.cli.common import (
    add_chat_template_arg,
    add_model_args,
    add_threads_arg,
    chat_template_from_args,
    load_models,
    precision_from_args,
    print_notes,
    print_warning,
    set_threads,
    startup_line,
)
from spectune.cli.policy_args import add_policy_args, policy_spec_from_args
from spectune.control.base import FixedK, KPolicy
from spectune.control.config import PolicySpec
from spectune.errors import InvalidParameterError
from spectune.models.facts import model_facts
from spectune.server.names import DEFAULT_DRAFT_DEADLINE, ENGINES, HISTORY_SCOPES
from spectune.server.run import DRAIN_SECONDS, LISTEN_BACKLOG

if TYPE_CHECKING:
    from spectune.sampling import SamplingParams
    from spectune.server.engines import EngineSettings, RequestDrafters

if TYPE_CHECKING:
    from spectune.server import Limits
    from spectune.server.limits import ApiKeys

GLOBAL_HISTORY_WARNING = (
    "--suffix-history-scope global: every request drafts from every client's earlier "
    "outputs, so a client can learn from its acceptance or latency whether some text was "
    "generated for another client (docs/serving.md, Multi-tenant serving)"
)

NO_TEMPLATE_NOTE = (
    "this model has no chat template: /v1/chat/completions answers 400; send plain prompts "
    "to /v1/completions, or start serve with --chat-template FILE|NAME"
)

__all__ = ["register"]

DEFAULT_MAX_BATCH = 16


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve an OpenAI-compatible API with speculative decoding"
    )
    add_model_args(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SPECTUNE_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $SPECTUNE_API_KEY; none: open)",
    )
    parser.add_argument(
        "--api-keys",
        type=Path,
        metavar="FILE",
        help="accept these keys too: one 'KEY TENANT' per line, each tenant's drafts kept "
        "apart from the others' (default: none)",
    )
    parser.add_argument(
        "--served-model-name",
        help="the model name clients send (default: the target's file or folder name, "
        "without .gguf)",
    )
    add_chat_template_arg(parser, "/v1/chat/completions")
    add_policy_args(parser)
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="batch",
        help="batch: requests decoded together; sequential: one request at a time",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help=f"requests decoded together (default {DEFAULT_MAX_BATCH}; 1 for a target on the "
        "transformers runtime, which decodes one sequence at a time: further requests queue)",
    )
    parser.add_argument(
        "--capacity", type=int, default=2048, help="most tokens per request (prompt + output)"
    )
    parser.add_argument(
        "--speculate-max-batch",
        type=int,
        default=None,
        help="no speculation while more requests than this run (measure it with the bench)",
    )
    parser.add_argument(
        "--draft-deadline",
        type=float,
        default=DEFAULT_DRAFT_DEADLINE,
        help="seconds a draft pass may take before the batch steps on without drafts "
        f"(a hung drafter; 0 = no deadline; default {DEFAULT_DRAFT_DEADLINE:g})",
    )
    parser.add_argument(
        "--suffix-history-tokens",
        type=int,
        default=262_144,
        help="suffix/hybrid drafts also draw on earlier requests' outputs, up to this many "
        "tokens in all (the least recently served tenant's go first; 0: off; default %(default)s)",
    )
    parser.add_argument(
        "--suffix-history-scope",
        choices=HISTORY_SCOPES,
        default=None,
        help="whose earlier outputs a request drafts from: none, its own tenant's, or every "
        "client's (global: clients can learn about each other's outputs) (default: tenant "
        "with API keys, none without)",
    )
    parser.add_argument(
        "--no-spec-usage",
        dest="spec_usage",
        action="store_false",
        help="leave the request's speculation counts out of responses' usage (they stay in "
        "/metrics). Default: responses' usage carries them",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body; more get a 413"
    )
    limits.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="longest prompt; longer ones get a 400 (default: --capacity - 1, the most that "
        "leaves room for one output token; must be below --capacity)",
    )
    limits.add_argument("--max-tokens", type=int, default=1024, help="largest max_tokens")
    limits.add_argument(
        "--default-max-tokens",
        type=int,
        default=256,
        help="max_tokens of a request that sets none (at most --max-tokens)",
    )
    limits.add_argument(
        "--max-requests", type=int, default=64, help="running + queued; more get a 429"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=DRAIN_SECONDS,
        help="on SIGTERM or Ctrl-C, seconds the requests in flight may take to finish while new "
        "ones get a 503; the rest then end with an error and the server exits 0 (default "
        "%(default)g: inside the 30 s a Kubernetes pod gets before SIGKILL; a second signal "
        "cuts the drain short)",
    )
    add_threads_arg(parser)
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning"), help="server log"
    )
    parser.set_defaults(run=run)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _keys(args: argparse.Namespace) -> ApiKeys | None:
    """The keys ``--api-key`` and ``--api-keys`` give (None: the server is open)."""
    from spectune.server.limits import DEFAULT_TENANT, ApiKeys

    single = {args.api_key: DEFAULT_TENANT} if args.api_key else {}
    if args.api_keys is not None:
        return ApiKeys.read(args.api_keys, extra=single)
    return ApiKeys(single) if single else None


def _history_scope(args: argparse.Namespace, keys: ApiKeys | None) -> str:
    scope: str | None = args.suffix_history_scope
    if scope is None:
        return "tenant" if keys is not None else "none"
    if scope == "tenant" and keys is None:
        raise InvalidParameterError(
            "--suffix-history-scope tenant needs API keys (--api-key or --api-keys): without "
            "them every client is the same tenant (say global to share the history knowingly)"
        )
    return scope


def run(args: argparse.Namespace) -> int:
    from spectune.control.registry import build_policy
    from spectune.server import Limits
    from spectune.server.engines import EngineSettings
    from spectune.server.run import check_drain_seconds, listen

    check_drain_seconds(args.drain_seconds)
    keys = _keys(args)
    args.keys, args.history_scope = keys, _history_scope(args, keys)
    args.template = chat_template_from_args(args)

    if args.served_model_name is not None and not args.served_model_name.strip():
        raise InvalidParameterError("--served-model-name must not be empty")
    if args.max_prompt_tokens is None:
        args.max_prompt_tokens = max(1, args.capacity - 1)  # --capacity is checked below
    elif args.max_prompt_tokens >= args.capacity:
        raise InvalidParameterError(
            f"--max-prompt-tokens {args.max_prompt_tokens} leaves no room for output in "
            f"--capacity {args.capacity} tokens per request: give a smaller one, or a larger "
            "--capacity"
        )
    spec = policy_spec_from_args(args)
    build_policy(spec)  # checks the options before loading models
    # One core stays with the request threads (the event loop, tokenising and streaming):
    # on two cores, 4 streaming clients got 1.5x the tokens/s from one compute thread as
    # from two (docs/threads.md).
    set_threads(args.threads, reserve=1)
    try:
        limits = Limits(
            max_body_bytes=args.max_body_bytes,
            max_prompt_tokens=args.max_prompt_tokens,
            max_tokens=args.max_tokens,
            default_max_tokens=min(args.default_max_tokens, args.max_tokens),
            max_requests=args.max_requests,
        )
    except ValueError as exc:
        raise InvalidParameterError(str(exc)) from exc
    max_batch, args.batch_line = _max_batch(args)
    settings = EngineSettings(
        kind=args.engine,
        max_batch=max_batch,
        capacity=args.capacity,
        speculate_max_batch=args.speculate_max_batch,
        draft_deadline=args.draft_deadline or None,
    )
    precision_from_args(args)  # a bad --dtype or --device is refused before the port is bound
    sock = listen(args.host, args.port)
    with sock:
        return _serve(args, spec, limits, settings, sock)


def _serve(
    args: argparse.Namespace,
    spec: PolicySpec,
    limits: Limits,
    settings: EngineSettings,
    sock: socket.socket,
) -> int:
    """Load the models and serve on ``sock`` until stopped (SIGINT or SIGTERM)."""
    from spectune.control.crossover import verify_curve_of
    from spectune.control.registry import build_policy
    from spectune.monitor.hub import Monitor
    from spectune.monitor.trace import TraceWriter
    from spectune.server import ServedModel, Service, create_app
    from spectune.server.engines import DraftSource, build_engine, scoped_history
    from spectune.server.metrics import ServerMetrics
    from spectune.server.run import serve_on

    notes: list[str] = []
    target, drafter = load_models(args, notes)
    draft, drafters = scoped_history(
        DraftSource(drafter), args.history_scope, args.suffix_history_tokens
    )

    curve = verify_curve_of(target.model)

    def default_policy(params: SamplingParams) -> KPolicy:
        if draft.name is None:
            return FixedK(0)
        return build_policy(spec, params=params, cost_curve=curve)

    engine, policies, context = build_engine(target.model, draft, settings, default_policy)
    # The file or folder name reads better than GGUF metadata names (which hold spaces).
    path = target.path
    name = args.served_model_name or (path.stem if path.is_file() else path.name)
    tokenizer = target.tokenizer.with_chat_template(args.template)
    if not tokenizer.has_chat_template:
        notes.append(NO_TEMPLATE_NOTE)
    served = ServedModel(
        name,
        target.model,
        tokenizer,
        drafter=draft.name,
        aliases=(args.target, target.model.info.name),
    )
    metrics = ServerMetrics()
    trace = TraceWriter(args.trace) if args.trace else None
    service = Service(
        served,
        engine,
        limits=limits,
        keys=args.keys,
        context_limit=context,
        policies=policies,
        drafters=drafters,
        monitor=Monitor(registry=metrics.registry, trace=trace, on_warning=print_warning),
        metrics=metrics,
        spec_usage=args.spec_usage,
    )
    if args.keys is None and not _is_loopback(args.host):
        print_warning(
            f"serving on {args.host} without an API key; anyone who can reach it can use it "
            "(set --api-key, --api-keys or SPECTUNE_API_KEY)"
        )
    if drafters is not None and drafters.scope == "global":
        print_warning(GLOBAL_HISTORY_WARNING)
    print_notes(notes)
    # Listening before the line below: a client that reads it and connects at once waits
    # in the backlog until uvicorn accepts, instead of being refused.
    sock.listen(LISTEN_BACKLOG)
    print(
        f"spectune: {startup_line(drafter, spec)}; engine {args.engine}, {args.batch_line}",
        file=sys.stderr,
    )
    print(
        f"spectune: serving '{name}' (drafter {draft.name or 'none'}, policy {spec.name}, engine "
        f"{args.engine}, suffix history {_history_line(drafters, args.suffix_history_tokens)}) at "
        f"http://{args.host}:{sock.getsockname()[1]}/v1",
        file=sys.stderr,
    )
    try:
        serve_on(
            create_app(service), sock, log_level=args.log_level, drain_seconds=args.drain_seconds
        )
    finally:
        if trace is not None:
            trace.close()  # every request has written its end event by now
    return 0


def _max_batch(args: argparse.Namespace) -> tuple[int, str]:
    """``--max-batch``, or without it the most requests the target decodes together
    (``DEFAULT_MAX_BATCH``; 1 on the transformers runtime, whose caches hold one sequence:
    further requests queue), read from its metadata before it loads; and the start-up
    line's words for it. The sequential engine gives each request its own cache."""
    if args.engine != "batch" or (args.max_batch is not None and args.max_batch < 1):
        chosen = DEFAULT_MAX_BATCH if args.max_batch is None else args.max_batch
        return chosen, f"max batch {chosen}"  # EngineSettings refuses one below 1
    facts = model_facts(args.target, args.runtime)
    if args.max_batch is not None:
        refusal = facts.batch_refusal(args.max_batch)
        if refusal is not None:
            raise InvalidParameterError(refusal)
        return args.max_batch, f"max batch {args.max_batch}"
    if facts.batch_refusal(DEFAULT_MAX_BATCH) is None:
        return DEFAULT_MAX_BATCH, f"max batch {DEFAULT_MAX_BATCH}"
    chosen = facts.max_batch or 1
    return chosen, (
        f"max batch {chosen} ({facts.runs_on}, one sequence at a time; further requests queue)"
    )


def _history_line(drafters: RequestDrafters | None, tokens: int) -> str:
    return "none" if drafters is None else f"{drafters.scope}, {tokens} tokens"
