"""vLLM's own speculation methods beside spectune's proposer, on held-apart prompts.

    .venv/bin/python scripts/vllm-proposer-bench.py [--k 4] [--max-tokens 96] [--rounds 1]
        [--methods off,empty,ngram,suffix,suffix-default,spectune,spectune-cost]
        [--costs FILE] [--concurrency 1,4] [--per-cell 4] [--json out.json]

Needs vLLM's venv (``make vllm``). Each method gets its own vLLM server on the converted
default target (the settings of ``spectune.engines.vllm.VllmSettings``); one server runs at
a time. Methods:

- ``off``             no speculation.
- ``empty``           vLLM's speculative path with a proposer that drafts nothing
                      (``NoDraftProposer``): what speculation costs vLLM per step before
                      any draft, the best a method reaches where drafting does not pay on
                      a vLLM left as it is (spectune's proposer skips part of that cost:
                      its option ``patch_sampler``).
- ``ngram``           vLLM's prompt lookup (its default n-gram size, 5) at K.
- ``suffix``          vLLM's suffix decoding (arctic-inference) at K.
- ``suffix-default``  suffix decoding at its default bound (K = its tree depth, 24).
- ``spectune``        spectune's proposer (``spectune.engines.vllm.proposer``) at K <= K:
                      its default drafter and policy, its trace read for the fallbacks.
- ``spectune-cost``   the proposer with policy ``cost`` on the cost profile ``--costs``
                      (``spectune tune --engine vllm`` writes it as OUT-costs.json).

Prompt groups, none of them in the shipped suffix index's corpus (the target's answers to
its training prompts): where drafting pays, greedy summarisation and code-edit prompts of
the shipped set's held-out ``test`` split (their answers repeat the input); where it does
not, creative writing at T = 1 (written here). Within a server the two groups alternate,
first at concurrency 1, then at 4; across rounds the method order is reversed every other
round, so a drift of the machine's load falls on every method alike.
Each (group, concurrency) cell has prompts of its own: no server sees a prompt twice, so
no method drafts from its own earlier answer to the same prompt.

Figures: output tokens per second of wall time over each group's requests (``usage``),
each method's over ``off``'s in the same round; vLLM's acceptance (its counters, read
before and after each group); for spectune, the share of steps held by a fallback, by
kind, from its trace. The machine's load average and the server's OpenMP threads are
printed with the table: on a shared machine, compare only figures of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from spectune.engines.costs import load_costs
from spectune.engines.hf_folder import convert_target
from spectune.engines.metrics import read_exposition
from spectune.engines.vllm import VllmSettings, vllm_server
from spectune.engines.vllm.options import PROPOSER_CLASS
from spectune.errors import InvalidParameterError
from spectune.monitor.trace import read_trace
from spectune.prompts import load_prompts

CREATIVE = (
    "Write a short poem about a lighthouse keeper who befriends a storm.",
    "Invent a fairy tale about a clockmaker's daughter and a talking fox.",
    "Describe an imaginary city where it rains upwards, as a travel diary entry.",
    "Write the opening of a mystery story set on a night train through the mountains.",
    "Compose a song about the first day of spring from the point of view of a seed.",
    "Tell a bedtime story about a dragon who is afraid of the dark.",
    "Write a letter from a pirate captain to her retired parrot.",
    "Imagine a museum of forgotten smells and describe three of its exhibits.",
)
EDITS = ("code-08", "code-17")  # code-edit prompts: the answer repeats the given code


def cells(per_cell: int, concurrency: list[int]) -> list[tuple[str, int, float, list[Any]]]:
    """(group, concurrency, temperature, chats) per cell. No prompt is used twice in a run:
    a server's second sight of a prompt would be drafted from its own earlier answer
    (suffix decoding's cache of responses, spectune's history)."""
    test = [p for p in load_prompts() if p.split == "test"]
    summaries = [list(p.messages) for p in test if p.category == "summarization"]
    edits = [list(p.messages) for p in test if p.id in EDITS]
    creative = [[{"role": "user", "content": c}] for c in CREATIVE]
    wanted = per_cell * len(concurrency)
    if wanted > min(len(summaries) + len(edits), len(creative)):
        raise ValueError(f"--per-cell {per_cell} needs more held-out prompts")
    out = []
    for j, c in enumerate(concurrency):
        pays = edits[j : j + 1] + summaries[j * per_cell : (j + 1) * per_cell]
        out.append(("summarise+edit T=0", c, 0.0, pays[:per_cell]))
        out.append(("creative T=1", c, 1.0, creative[j * per_cell : (j + 1) * per_cell]))
    return out


METHODS = ("off", "empty", "ngram", "suffix", "suffix-default", "spectune", "spectune-cost")
NO_DRAFTS = "spectune.engines.vllm.proposer.NoDraftProposer"


def speculative_config(method: str, k: int) -> dict[str, Any] | None:
    proposer = {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": k}
    return {
        "off": None,
        "empty": {"method": "custom_class", "model": NO_DRAFTS, "num_speculative_tokens": k},
        "ngram": {"method": "ngram", "num_speculative_tokens": k},
        "suffix": {"method": "suffix", "num_speculative_tokens": k},
        "suffix-default": {"method": "suffix"},
        "spectune": proposer,
        "spectune-cost": proposer,
    }[method]


def proposer_options(method: str, trace: Path, costs: Path | None) -> dict[str, Any] | None:
    """The proposer's ``spectune`` table for a spectune method (None for vLLM's own)."""
    if method == "spectune":
        return {"trace": str(trace)}
    if method == "spectune-cost":
        assert costs is not None  # main() refuses spectune-cost without --costs
        return {"trace": str(trace), "policy": "cost", "costs": str(costs)}
    return None


def counters(url: str) -> tuple[int, int]:
    """vLLM's (draft tokens, accepted) so far; (0, 0) without speculation."""
    text = httpx.get(url + "/metrics", timeout=30).text
    if "vllm:spec_decode_num_draft_tokens" not in text:
        return 0, 0
    counts = read_exposition(text, "vllm").counts
    return (0, 0) if counts is None else (counts.num_draft_tokens, counts.accepted)


def chat(url: str, model: str, messages: list[dict[str, str]], t: float, n: int) -> int:
    body = {"model": model, "messages": messages, "max_tokens": n, "temperature": t}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def run_group(url: str, model: str, chats: list[Any], t: float, n: int, c: int) -> dict[str, Any]:
    before = counters(url)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=c) as pool:
        tokens = sum(pool.map(lambda m: chat(url, model, m, t, n), chats))
    wall = time.perf_counter() - start
    drafted, accepted = (a - b for a, b in zip(counters(url), before, strict=True))
    return {
        "tokens": tokens,
        "seconds": round(wall, 3),
        "tokens_per_second": round(tokens / wall, 2),
        "draft_tokens": drafted,
        "acceptance": round(accepted / drafted, 3) if drafted else None,
    }


def threads_of(log: Path) -> str:
    """The OpenMP threads vLLM bound, as its log says."""
    text = log.read_text(errors="replace")
    found = re.findall(r"core ids=\[([0-9, ]*)\]", text)
    return f"{len(found[-1].split(','))} (cores {found[-1]})" if found else f"see {log}"


def fallbacks(trace: Path) -> dict[str, dict[str, Any]]:
    """Per temperature: steps, and the share held by each fallback kind (spectune's trace)."""
    out: dict[str, dict[str, Any]] = {}
    for request in read_trace(trace):
        key = f"T={request.info.get('temperature', 0.0):g}"
        entry = out.setdefault(key, {"steps": 0, "drafted": 0, "accepted": 0, "held": {}})
        for step in request.steps:
            record = step.record
            entry["steps"] += 1
            entry["drafted"] += record.num_draft_tokens
            entry["accepted"] += record.accepted
            if record.fallback:
                kind = record.fallback.split(":", 1)[0]
                entry["held"][kind] = entry["held"].get(kind, 0) + 1
    for entry in out.values():
        entry["held"] = {k: round(v / entry["steps"], 3) for k, v in entry["held"].items()}
    return out


def serve_and_run(method: str, args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    spec = speculative_config(method, args.k)
    trace = work / f"{method}-trace.jsonl"
    options = proposer_options(method, trace, args.costs)
    extra: tuple[str, ...] = ()
    if options is not None:
        trace.unlink(missing_ok=True)
        extra = ("--additional-config", json.dumps({"spectune": options}))
    log = work / f"{method}.log"
    result: dict[str, Any] = {"method": method, "load_before": os.getloadavg()[0], "groups": {}}
    with vllm_server(VllmSettings(model, spec, extra_args=extra), log=log) as url:
        chat(url, str(model), [{"role": "user", "content": "Say hello."}], 0.0, 8)  # warm-up
        for name, c, t, chats in cells(args.per_cell, args.concurrency):
            run = run_group(url, str(model), chats, t, args.max_tokens, c)
            result["groups"][f"{name} c={c}"] = run
            print(f"  {method:15} {name:20} c={c}: {run}", flush=True)
    result["load_after"] = os.getloadavg()[0]
    result["threads"] = threads_of(log)
    if options is not None:
        result["fallbacks"] = fallbacks(trace)
    return result


def table(rounds: list[list[dict[str, Any]]]) -> str:
    """Median over rounds of tokens/s and of the ratio to off in the same round."""
    methods = [r["method"] for r in rounds[0]]
    cells = list(rounds[0][0]["groups"])
    lines = ["| group | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for cell in cells:
        row = [cell]
        for method in methods:
            rates, ratios, accepts = [], [], []
            for runs in rounds:
                by = {r["method"]: r for r in runs}
                rate = by[method]["groups"][cell]["tokens_per_second"]
                rates.append(rate)
                if "off" in by:
                    ratios.append(rate / by["off"]["groups"][cell]["tokens_per_second"])
                if by[method]["groups"][cell]["acceptance"] is not None:
                    accepts.append(by[method]["groups"][cell]["acceptance"])
            text = f"{statistics.median(rates):.1f} tok/s"
            if ratios and method != "off":
                text += f" ({statistics.median(ratios):.2f}x)"
            if accepts:
                text += f", acc {statistics.median(accepts):.0%}"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def error(message: str) -> None:
    print(f"spectune: error: {message}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=4, help="the K bound of every method")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--per-cell", type=int, default=4, help="prompts per group and concurrency")
    parser.add_argument("--methods", default="off,ngram,suffix,spectune", help=", ".join(METHODS))
    parser.add_argument(
        "--costs", type=Path, default=None, help="the cost profile spectune-cost prices K on"
    )
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown or args.k < 1 or args.rounds < 1 or args.max_tokens < 1:
        error(f"bad arguments ({', '.join(unknown) or 'k, rounds, max-tokens'})")
        return 2
    if "spectune-cost" in methods:
        if args.costs is None:
            error("method spectune-cost needs --costs FILE (spectune tune --engine vllm writes it)")
            return 2
        try:
            load_costs(args.costs)
        except InvalidParameterError as exc:
            error(str(exc))
            return 2
        args.costs = args.costs.resolve()  # the server reads it from its own directory
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
        if min(args.concurrency) < 1 or args.per_cell < 1:
            raise ValueError("--concurrency and --per-cell must be positive")
        cells(args.per_cell, args.concurrency)  # enough prompts, before any server starts
    except ValueError as exc:
        error(str(exc))
        return 2
    work = Path(tempfile.mkdtemp(prefix="vllm-proposer-bench-"))
    model = work / "target"
    convert_target("default", model)
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()}", flush=True)
    rounds = []
    for i in range(args.rounds):
        order = methods if i % 2 == 0 else methods[::-1]
        rounds.append([serve_and_run(m, args, model, work) for m in order])
    print()
    print(table(rounds))
    for runs in rounds:
        for r in runs:
            print(
                f"{r['method']}: load {r['load_before']:.2f} -> {r['load_after']:.2f}, "
                f"OpenMP threads {r['threads']}"
                + (f", fallbacks {r['fallbacks']}" if "fallbacks" in r else "")
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "rounds": rounds},
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
