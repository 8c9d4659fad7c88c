"""``spectune generate``: speculative generation of one prompt, streamed, with statistics."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from spectune.cli.common import (
    add_chat_template_arg,
    add_compile_arg,
    add_model_args,
    add_sampling_args,
    add_threads_arg,
    chat_template_from_args,
    load_models,
    print_notes,
    print_warning,
    sampling_from_args,
    set_threads,
    startup_line,
)
from spectune.cli.paths import output_file
from spectune.cli.policy_args import add_policy_args, policy_spec_from_args
from spectune.control.base import FixedK, KPolicy
from spectune.errors import InvalidParameterError, PromptError
from spectune.models.chat_templates import ChatTemplate
from spectune.models.facts import chat_template_known, model_facts
from spectune.models.machine import LoadMeter
from spectune.models.names import LLAMACPP
from spectune.models.refs import DEFAULT_TARGET
from spectune.models.tokenizer import NO_CHAT_TEMPLATE, Tokenizer, check_text

if TYPE_CHECKING:
    from spectune.decode.engine import Generation, SpeculativeEngine
    from spectune.drafters.base import Drafter
    from spectune.models.base import LanguageModel
    from spectune.monitor.hub import RequestMonitor
    from spectune.sampling import SamplingParams

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("generate", help="generate text with speculative decoding")
    parser.add_argument("prompt", nargs="?", help="raw prompt text (no chat template)")
    parser.add_argument("--chat", help="a user message, sent through the model's chat template")
    parser.add_argument("--system", help="system message for --chat")
    add_chat_template_arg(parser, "--chat and --system")
    parser.add_argument(
        "--allow-special-tokens",
        action="store_true",
        help="parse special-token text (e.g. '<|im_end|>') in a raw prompt into special "
        "tokens; without it, and always for --chat/--system, such text stays plain text",
    )
    add_model_args(parser)
    add_sampling_args(parser)
    add_policy_args(parser)
    parser.add_argument("--compare", action="store_true", help="also decode without speculation")
    add_compile_arg(parser)
    parser.add_argument(
        "--tree-width",
        type=int,
        default=None,
        help="draft a token tree: children per expanded node (a draft model's, or the top "
        "continuations of suffix drafting, also inside a hybrid; K = depth)",
    )
    parser.add_argument(
        "--tree-nodes", type=int, default=None, help="node budget of a token tree (default 16)"
    )
    parser.add_argument(
        "--tree-min-prob",
        type=float,
        default=0.0,
        help="expand only tree nodes whose cumulative draft probability reaches this",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object, no streaming")
    add_threads_arg(parser)
    parser.set_defaults(run=run)


def prompt_tokens(args: argparse.Namespace, tokenizer: Tokenizer) -> list[int]:
    if args.chat is not None:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.chat})
        return tokenizer.encode_chat(messages)
    return tokenizer.encode(args.prompt or "", allow_special_tokens=args.allow_special_tokens)


def summary(gen: Generation, watch: RequestMonitor | None = None) -> dict[str, Any]:
    fallbacks = {} if watch is None else dict(watch.snapshot().fallback_steps)
    counts = gen.counts
    return {
        "tokens": len(gen.tokens),
        "steps": counts.steps,
        "tokens_per_second": round(gen.tokens_per_second, 2),
        "drafted": counts.num_draft_tokens,  # a tree: its nodes
        "positions": counts.positions,  # the acceptance rate's denominator
        "accepted": counts.accepted,
        "acceptance_rate": round(gen.acceptance_rate, 4),
        "mean_accepted_length": round(gen.mean_accepted_length, 3),
        "finish_reason": gen.finish_reason,
        "prefill_seconds": round(gen.prefill_time, 4),
        "decode_seconds": round(gen.decode_time, 4),
        # token-level fallbacks (steps cut short by a rejection: fewer kept than the positions
        # tested, as the monitor counts them) and steps under each other fallback
        "rejections": counts.rejections,
        "fallback_steps": fallbacks,
    }


def decode(
    engine: SpeculativeEngine,
    tokenizer: Tokenizer,
    prompt: list[int],
    params: SamplingParams,
    policy: KPolicy,
    echo: bool,
    watch: RequestMonitor | None = None,
) -> tuple[Generation, str]:
    from spectune.decode.engine import Generation
    from spectune.decode.text import stream_text

    gen = Generation(prompt_tokens=prompt)
    text: list[str] = []
    start = time.perf_counter()
    for chunk in stream_text(engine, tokenizer, prompt, params, policy=policy):
        if not gen.steps:
            # The first chunk comes after the prefill and the first step: the prefill is
            # the time that step does not account for (``SpeculativeEngine.run``'s rule;
            # the later steps' echo and text time is no part of it).
            gen.prefill_time = time.perf_counter() - start - chunk.record.step_time
        if watch is not None:
            watch.observe(chunk.record)
        gen.add(chunk.record)
        text.append(chunk.text)
        if echo:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    return gen, "".join(text)


def tree_drafter(
    drafter: Drafter | None, target: LanguageModel, args: argparse.Namespace
) -> Drafter:
    """The tree form of ``--draft`` (a draft model, a feature head, suffix drafting or a
    hybrid's suffix source; native runtime)."""
    from spectune.drafters.pairing import tree_drafter_for
    from spectune.drafters.tree import TreeShape

    shape = TreeShape(
        width=args.tree_width if args.tree_width is not None else 2,
        nodes=args.tree_nodes if args.tree_nodes is not None else 16,
        min_path_prob=args.tree_min_prob,
    )
    return tree_drafter_for(drafter, target, shape)


def check_prompt_args(args: argparse.Namespace) -> None:
    """Refuse combinations that would silently ignore part of the command line."""
    if args.chat is not None and args.prompt is not None:
        raise InvalidParameterError("give a raw prompt or --chat, not both")
    if args.chat is None and args.system is not None:
        raise InvalidParameterError("--system needs --chat")
    if args.chat is None and args.chat_template is not None:
        raise InvalidParameterError("--chat-template needs --chat (a raw prompt takes no template)")
    if args.chat is not None and args.allow_special_tokens:
        raise InvalidParameterError(
            "--allow-special-tokens applies to raw prompts; --chat text is always plain text"
        )
    if args.tree_min_prob != 0.0 and args.tree_width is None and args.tree_nodes is None:
        raise InvalidParameterError("--tree-min-prob needs a tree (--tree-width or --tree-nodes)")
    if not (args.chat or args.prompt):
        raise PromptError("the prompt is empty (give a prompt or --chat TEXT)")
    # Undecodable bytes on the command line arrive as lone surrogates: refuse them before
    # the models load.
    for name, text in (
        ("the prompt", args.prompt),
        ("--chat", args.chat),
        ("--system", args.system),
    ):
        if text is not None:
            check_text(text, name)


def chat_template_for(args: argparse.Namespace) -> ChatTemplate | None:
    """``--chat-template`` checked; a ``--chat`` on a model whose metadata holds no
    template, without one, is refused here, before any weight loads."""
    template = chat_template_from_args(args)
    if args.chat is not None and template is None and chat_template_known(args.target) is False:
        raise PromptError(NO_CHAT_TEMPLATE)
    return template


def check_model_args(args: argparse.Namespace) -> None:
    """Refuse, before any model loads, what would fail only once the models are loaded
    (and, with a draft, the verification curve measured: minutes on a compiled target)."""
    tree = args.tree_width is not None or args.tree_nodes is not None
    if tree and args.compile:
        raise InvalidParameterError(
            "token trees (--tree-width, --tree-nodes) and --compile do not go together: "
            "compiled steps take no tree attention mask (drop one)"
        )
    if tree and args.runtime == LLAMACPP:
        raise InvalidParameterError(
            "token trees need a runtime with tree attention masks, not llamacpp (--runtime native)"
        )
    refusal = model_facts(args.target, args.runtime).tree_refusal() if tree else None
    if refusal is not None:
        raise InvalidParameterError(refusal)
    if args.trace is not None:
        target = None if args.target == DEFAULT_TARGET else args.target
        inputs = [
            ("--target", target),
            ("--draft", args.draft),
            ("--policy-file", args.policy_file),
        ]
        output_file(args.trace, "--trace", inputs)


def run(args: argparse.Namespace) -> int:
    from spectune.control.crossover import verify_curve_of
    from spectune.control.registry import build_policy
    from spectune.decode.engine import SpeculativeEngine
    from spectune.monitor.hub import Monitor
    from spectune.monitor.trace import TraceWriter

    check_prompt_args(args)
    check_model_args(args)
    template = chat_template_for(args)
    spec = policy_spec_from_args(args)
    params = sampling_from_args(args)
    build_policy(spec, params=params)  # checks the options before loading models
    set_threads(args.threads)
    notes: list[str] = []
    target, drafter = load_models(args, notes)
    policy = build_policy(spec, params=params, cost_curve=verify_curve_of(target.model))
    if args.tree_width is not None or args.tree_nodes is not None:
        drafter = tree_drafter(drafter, target.model, args)
    prompt = prompt_tokens(args, target.tokenizer.with_chat_template(template))
    trace = TraceWriter(args.trace) if args.trace else None  # a bad path fails before output
    print_notes(notes)
    print(f"spectune: {startup_line(drafter, spec)}", file=sys.stderr, flush=True)
    engine = SpeculativeEngine(target.model, drafter)
    info = {
        "policy": spec.name,
        "options": dict(spec.options),
        "temperature": params.temperature,
        "target": target.model.info.name,
        "drafter": drafter.name if drafter else "none",
        "prompt_tokens": len(prompt),
        "prompt": list(prompt),
    }
    meter = LoadMeter()  # a speedup timed beside other work says so
    try:
        watch = Monitor(trace=trace, on_warning=print_warning).request(policy=policy, info=info)
        gen, text = decode(engine, target.tokenizer, prompt, params, policy, not args.json, watch)
        watch.finish()
        plain = None
        if args.compare:
            plain_engine = SpeculativeEngine(target.model)
            plain, _ = decode(plain_engine, target.tokenizer, prompt, params, FixedK(0), False)
            if trace is not None:  # a later request event adds to the info: the baseline
                baseline = {"baseline_tokens_per_second": plain.tokens_per_second}
                trace.request_started(watch.request_id, baseline)
    finally:
        if trace is not None:
            trace.close()
    report: dict[str, Any] = {
        "text": text,
        "target": info["target"],
        "drafter": info["drafter"],
        "policy": spec.name,
        "k": gen.steps[0].k if gen.steps else 0,
        "prompt_tokens": len(prompt),
        "speculative": summary(gen, watch),
    }
    if plain is not None:
        report["plain"] = summary(plain)
        report["speedup"] = round(
            gen.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else 0.0, 3
        )
        if params.greedy:
            report["identical_to_plain"] = plain.tokens == gen.tokens
    load = meter.stop()
    report["machine_load"] = load.as_json()
    if load.busy:
        report["machine_note"] = load.line("this run")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_summary(report)
    return 0


def print_summary(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    console.print()
    title = f"{report['target']} with drafter {report['drafter']}"
    table = Table(title=f"{title}, policy {report['policy']} (first K = {report['k']})")
    table.add_column("")
    table.add_column("speculative", justify="right")
    if "plain" in report:
        table.add_column("plain", justify="right")
    rows = [
        ("tokens", "tokens"),
        ("tokens/s", "tokens_per_second"),
        ("acceptance rate", "acceptance_rate"),
        ("mean accepted length", "mean_accepted_length"),
        ("steps", "steps"),
        ("rejections (token fallback)", "rejections"),
        ("finish", "finish_reason"),
    ]
    for label, key in rows:
        cells = [str(report["speculative"][key])]
        if "plain" in report:
            cells.append(str(report["plain"][key]))
        table.add_row(label, *cells)
    console.print(table)
    fallbacks = report["speculative"]["fallback_steps"]
    listed = ", ".join(f"{kind} {n}" for kind, n in sorted(fallbacks.items()))
    console.print(f"steps under fallback: {listed or 'none'}")
    if "speedup" in report:
        line = f"speedup over plain decoding: {report['speedup']:.2f}x"
        if "identical_to_plain" in report:
            line += f"; greedy output identical to plain: {report['identical_to_plain']}"
        console.print(line)
    if "machine_note" in report:
        console.print(f"note: {report['machine_note']}")
