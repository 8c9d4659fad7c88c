"""``spectune tune``: fit the adaptive K policy to a workload and this machine; write a policy file.

Two sources of steps:

- ``--trace FILE`` (repeatable): step traces written by ``generate --trace`` or ``serve
  --trace``; costs come from the traces' own times (the machine they were recorded on).
- otherwise the prompt set's ``dev`` split (``--prompts``, the shipped set by default) is
  decoded at a fixed ``--record-k`` with ``--draft`` on ``--target``, at each temperature,
  and the target's verification-cost curve is measured here.

The search (``spectune.control.tune``) replays those steps through candidate ``threshold``
policies and keeps the fastest predicted. The result is a policy file (``--out``) that
``generate``, ``bench`` and ``serve`` take with ``--policy-file``, and a report (``--report``,
markdown, with the same figures as JSON beside it). In the prompt-set mode the choice is then
confirmed on ``--confirm-prompts`` prompts of the held-out ``test`` split, never seen by the
search: plain decoding, the seed's policy, the best fixed K and the tuned policy, interleaved
per prompt through the benchmark's runner.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.cli.common import (
    add_chat_template_arg,
    add_model_args,
    add_threads_arg,
    parse_numbers,
    round_robin,
    set_threads,
)
from spectune.cli.paths import distinct_outputs, output_file, write_text
from spectune.cli.tune_llamacpp import add_args as add_llamacpp_args
from spectune.cli.tune_llamacpp import run_llamacpp
from spectune.cli.tune_report import print_summary, report_data, report_markdown
from spectune.cli.tune_vllm import add_args as add_vllm_args
from spectune.cli.tune_vllm import run_vllm
from spectune.control.config import PolicySpec, load_policy_file
from spectune.errors import InvalidParameterError
from spectune.models.machine import LoadMeter

if TYPE_CHECKING:
    from spectune.control.tune import TuneResult
    from spectune.control.workload import RecordedRequest, StepCosts, Workload

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="fit the K policy's thresholds to your traces or prompts; writes a policy file",
        description="Replays recorded steps through candidate threshold policies, keeps the "
        "fastest predicted, writes it as a --policy-file TOML and a report.",
    )
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        help="a step trace (generate/serve --trace) to tune on (repeatable); without one, "
        "the prompt set's dev split is decoded",
    )
    add_model_args(parser)
    parser.add_argument("--prompts", type=Path, default=None, help="JSONL prompt file")
    add_chat_template_arg(parser, "the prompts' chats (on a model without one they run plain)")
    parser.add_argument("--categories", default=None, help="comma-separated categories to keep")
    parser.add_argument(
        "--limit-per-category", type=int, default=2, help="dev prompts per category"
    )
    parser.add_argument("--temperatures", default="0", help="comma-separated, e.g. 0,0.7")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens decoded per dev prompt")
    parser.add_argument(
        "--record-k", type=int, default=8, help="fixed K the dev prompts are decoded with"
    )
    parser.add_argument(
        "--confirm-prompts",
        type=int,
        default=4,
        help="held-out test prompts the tuned policy is confirmed on (0: no confirmation)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled decoding")
    add_threads_arg(parser)
    parser.add_argument(
        "--record-trace", default=None, help="also write the dev decoding as a step trace"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="policy file (default: tuned-policy.toml; llamacpp-flags.json with --engine llamacpp)",
    )
    parser.add_argument(
        "--report", type=Path, default=None, help="markdown report (default: OUT with .md)"
    )
    add_llamacpp_args(parser)
    add_vllm_args(parser)
    parser.set_defaults(run=run)


def check_args(args: argparse.Namespace) -> tuple[float, ...]:
    """Everything checkable before a model loads; returns the temperatures."""
    from spectune.records import validate_k
    from spectune.sampling import SamplingParams

    if args.trace and (args.draft is not None or args.prompts is not None):
        raise InvalidParameterError(
            "give --trace files to replay, or --draft/--prompts to decode, not both"
        )
    if args.trace and args.chat_template is not None:
        raise InvalidParameterError("--chat-template applies to --prompts, not to --trace files")
    temperatures = parse_numbers(args.temperatures, float, "--temperatures")
    for temperature in temperatures:
        SamplingParams(temperature=temperature)  # its own range check
    if args.max_tokens < 2:
        raise InvalidParameterError(f"--max-tokens must be >= 2, got {args.max_tokens}")
    validate_k(args.record_k)
    if not args.trace and args.draft == "none":
        raise InvalidParameterError("tuning needs a drafter (--draft)")
    if args.confirm_prompts < 0:
        raise InvalidParameterError(f"--confirm-prompts must be >= 0, got {args.confirm_prompts}")
    if args.limit_per_category < 1:
        raise InvalidParameterError("--limit-per-category must be at least 1")
    set_threads(args.threads)
    check_outputs(args)
    return temperatures


def report_path(args: argparse.Namespace) -> Path:
    """``--report``, by default ``--out`` with ``.md``."""
    return Path(args.report or args.out.with_suffix(".md"))


def check_outputs(args: argparse.Namespace) -> None:
    """Every file the run writes can be written, and none is an input or another output
    (``--out T`` for the trace ``T`` would replace the recording with the policy)."""
    report = report_path(args)
    inputs = [*(("--trace", trace) for trace in args.trace), ("--prompts", args.prompts)]
    outputs = [
        ("--out", args.out),
        ("--report", report),
        ("the report's JSON", report.with_suffix(".json")),
        ("--record-trace", args.record_trace),
    ]
    for flag, path in outputs:
        if path is not None:
            output_file(path, flag, inputs)
    distinct_outputs(outputs)


def requests_from_traces(paths: Sequence[str]) -> tuple[list[RecordedRequest], list[str]]:
    """Every request of every trace, with its temperature (0 when the trace has none)."""
    from spectune.control.workload import RecordedRequest
    from spectune.monitor.trace import TraceError, read_trace

    requests: list[RecordedRequest] = []
    untagged = 0
    for path in paths:
        for request in read_trace(path):
            temperature = request.info.get("temperature", None)
            if temperature is None:
                untagged += 1
                temperature = 0.0
            if not isinstance(temperature, int | float) or not temperature >= 0:
                raise TraceError(
                    f"{path}: request {request.request}: temperature must be a number >= 0"
                )
            steps = tuple(step.record for step in request.steps)
            requests.append(RecordedRequest(float(temperature), steps))
    notes = []
    if untagged:
        notes.append(f"{untagged} request(s) carry no temperature (older traces): taken as 0")
    return requests, notes


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from spectune.control.tune import params_spec, policy_toml
    from spectune.control.workload import fit_costs, fit_workload

    if args.engine == "llamacpp":
        if args.chat_template is not None:
            raise InvalidParameterError(
                "--chat-template applies to spectune's engine; llama-server applies the "
                "model's own chat template"
            )
        return run_llamacpp(args)
    if args.engine == "vllm":
        return run_vllm(args)
    args.out = args.out or Path("tuned-policy.toml")
    temperatures = check_args(args)
    console = Console()  # progress and notes on stdout: stderr keeps one line per error
    report = report_path(args)
    started = time.perf_counter()
    meter = LoadMeter()
    if args.trace:
        requests, notes = requests_from_traces(args.trace)
        workload = fit_workload(requests, seed=args.seed)
        costs = fit_costs(requests)
        if costs.sizes_seen < 3:
            notes.append(
                f"the traces time the target at {costs.sizes_seen} chunk size(s) only: the "
                "verification curve between them is a straight line (a trace recorded at one "
                "fixed K says little about other K); prefer traces of an adaptive policy, or "
                "the prompt-set mode, which measures the curve"
            )
        context: dict[str, Any] = {"source": "traces", "traces": list(args.trace)}
        recording = None
    else:
        recording = _Recording(args, temperatures, console)
        requests, costs = recording.record()
        workload = fit_workload(requests, seed=args.seed)
        notes = list(recording.notes)
        context = recording.context()
    result = _search(workload, costs, console)
    spec = params_spec(result.best)
    header = [
        f"written by: {args.command_line}",
        f"predicted {result.predicted.tokens_per_second:.3g} tokens/s on the tuning workload; "
        f"the seed's policy {result.seed.tokens_per_second:.3g}; "
        f"fixed K={result.best_fixed_k} {result.fixed[result.best_fixed_k].tokens_per_second:.3g}",
    ]
    write_text(args.out, policy_toml(spec, header))
    tuned = load_policy_file(args.out)  # what the other commands will read
    confirm = recording.confirm(tuned, result) if recording and args.confirm_prompts else None
    load = meter.stop()  # what tune timed on this machine: the recording and the confirmation
    if recording is not None and load.busy:
        notes.append(load.line("tune's measurements"))
    data = report_data(args, context, workload, costs, result, confirm, notes)
    data["machine_load"] = load.as_json() if recording is not None else None
    data["seconds"] = round(time.perf_counter() - started, 1)
    write_text(report, report_markdown(data))
    write_text(report.with_suffix(".json"), json.dumps(data, indent=2) + "\n")
    print_summary(data, args.out, report)
    return 0


def _search(workload: Workload, costs: StepCosts, console: Any) -> TuneResult:
    from rich.progress import Progress

    from spectune.control.tune import planned_evaluations, search

    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("searching policies", total=planned_evaluations(workload))
        result = search(workload, costs, on_evaluation=lambda: progress.advance(task))
        progress.update(task, completed=planned_evaluations(workload))
    return result


class _Recording:
    """The prompt-set mode: the models, the dev recording and the held-out confirmation."""

    def __init__(self, args: argparse.Namespace, temperatures: tuple[float, ...], console: Any):

        from spectune.bench.plan import load_bench_prompts
        from spectune.cli.common import chat_template_from_args, load_models
        from spectune.prompts import load_prompts, prompt_encoding

        categories = (
            tuple(c.strip() for c in args.categories.split(",")) if args.categories else None
        )
        template = chat_template_from_args(args)
        # A bad file fails before models load.
        records = load_prompts(args.prompts, categories=categories)
        self.args = args
        self.temperatures = temperatures
        self.console = console
        console.print(f"loading {args.target} and drafter {args.draft or '(default)'}")
        notes: list[str] = []
        self.target, drafter = load_models(args, notes)
        if drafter is None:
            raise InvalidParameterError("tuning needs a drafter (--draft)")
        self.drafter = drafter
        encoding = prompt_encoding(self.target.tokenizer, template, records)
        tokenizer = encoding.tokenizer
        self.prompt_format = encoding.format
        self.notes = [] if encoding.note is None else [encoding.note]  # for the report
        notes += self.notes
        self.dev = load_bench_prompts(
            tokenizer,
            args.prompts,
            categories=categories,
            split="dev",
            limit_per_category=args.limit_per_category,
        )
        test = load_bench_prompts(tokenizer, args.prompts, categories=categories, split="test")
        self.held_out = round_robin(test, args.confirm_prompts)
        for note in notes:  # after the input is checked (``load_models``)
            console.print(f"note: {note}")

    def context(self) -> dict[str, Any]:
        return {
            "source": "prompts",
            "target": self.target.model.info.name,
            "drafter": self.drafter.name,
            "temperatures": list(self.temperatures),
            "dev_prompts": [p.id for p in self.dev],
            "prompt_format": self.prompt_format,
            "record_k": self.args.record_k,
            "max_tokens": self.args.max_tokens,
        }

    def record(self) -> tuple[list[RecordedRequest], StepCosts]:
        """Decode the dev prompts at the fixed record K; measure the verification curve."""
        from rich.progress import Progress

        from spectune.control.costs import measure_forward_curve
        from spectune.control.workload import fit_costs
        from spectune.monitor.hub import Monitor
        from spectune.monitor.recording import record_fixed_k
        from spectune.monitor.trace import TraceWriter

        args = self.args
        trace = TraceWriter(args.record_trace) if args.record_trace else None
        total = len(self.dev) * len(self.temperatures)
        try:
            with Progress(console=self.console) as progress:
                task = progress.add_task("measuring the verification cost", total=None)
                # Interpolated in between (CostCurve.time): five sizes cover K = 0 .. 8.
                sizes = tuple(sorted({1, 2, 4, 6, 9, args.record_k + 1}))
                curve = measure_forward_curve(self.target.model, sizes, repeats=3)
                progress.update(task, total=1, completed=1)
                task = progress.add_task(f"decoding dev prompts at K={args.record_k}", total=total)
                requests = record_fixed_k(
                    self.target.model,
                    self.drafter,
                    [(prompt.id, prompt.tokens) for prompt in self.dev],
                    args.record_k,
                    args.max_tokens,
                    self.temperatures,
                    seed=args.seed,
                    monitor=Monitor(trace=trace),
                    on_request=lambda: progress.advance(task),
                )
        finally:
            if trace is not None:
                trace.close()
        return requests, fit_costs(requests, curve)

    def confirm(self, tuned: PolicySpec, result: TuneResult) -> dict[str, Any]:
        """Plain, the seed's policy, the best fixed K and the tuned one on held-out prompts."""
        from rich.progress import Progress

        from spectune.bench.assemble import Workbench
        from spectune.bench.runner import Schedule, run_interleaved
        from spectune.bench.systems import SpectuneSystem, SystemInfo
        from spectune.control.base import FixedK
        from spectune.control.crossover import runtime_of
        from spectune.control.registry import build_policy

        model, k = self.target.model, result.best_fixed_k
        factories = {
            "plain": lambda params: FixedK(0),
            "seed": lambda params: build_policy(PolicySpec("threshold"), params=params),
            "best fixed K": lambda params: FixedK(k),
            "tuned": lambda params: build_policy(tuned, params=params),
        }
        systems = [
            SpectuneSystem.build(
                SystemInfo(name, "spectune"), model, None if name == "plain" else self.drafter, f
            )
            for name, f in factories.items()
        ]
        schedule = Schedule(
            tuple(self.held_out), self.temperatures, 1, self.args.max_tokens, self.args.seed
        )
        sums: dict[str, list[float]] = {name: [0, 0.0] for name in factories}
        texts: dict[str, list[tuple[int, ...]]] = {name: [] for name in factories}
        with Progress(console=self.console) as progress:
            total = len(systems) * schedule.calls_per_system
            task = progress.add_task("confirming on held-out prompts", total=total)

            def listen(m: Any) -> None:
                sums[m.system][0] += len(m.result.tokens)
                sums[m.system][1] += m.result.decode_seconds or 0.0
                if m.temperature == 0:
                    texts[m.system].append(m.result.tokens)
                progress.advance(task)

            bench = Workbench(runtime_of(model), model, None, list(systems), {})
            run_interleaved(bench, schedule, listen)
        measured = {
            name: {
                "tokens": int(tokens),
                "seconds": round(seconds, 3),
                "tokens_per_second": round(tokens / seconds, 2) if seconds else None,
            }
            for name, (tokens, seconds) in sums.items()
        }
        return {
            "prompts": [p.id for p in self.held_out],
            "best_fixed_k": k,
            "measured": measured,
            "greedy_identical_to_plain": (
                texts["tuned"] == texts["plain"] if 0 in self.temperatures else None
            ),
        }
