#!/usr/bin/env python3
"""Decoding speed on a quiet and on a busy machine, per thread setting (docs/threads.md).

    .venv/bin/python scripts/busy-machine.py [--runtimes int4,fp32,llamacpp] [--rounds 2]
        [--candidates-on int4,llamacpp] [--tokens 48] [--out docs/results/threads]

For each thread setting (``SETTINGS`` on the ``--candidates-on`` runtimes, the three of
``MAIN_SETTINGS`` on the others) and runtime, a child process loads the default
target and its suffix drafter once, then times plain and speculative greedy decoding
(``--tokens`` tokens of one chat prompt, the first of ``--repeats`` runs discarded as
warm-up) with 0, 1 and 2 busy processes beside it (each a Python loop that never
sleeps). ``server`` children start ``spectune serve`` with the setting's environment
and time 4 concurrent streaming clients the same way. Settings run in a rotating order,
round after round, so that drift on the machine falls on all of them alike. Results:
``threads.jsonl`` (one line per measurement) and ``threads.md`` (the median table).

Run it on an otherwise quiet machine: ``cat /proc/loadavg`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROMPT = "Write a short paragraph about the history of the bicycle."
SERVER_PROMPTS = (
    PROMPT,
    "Explain how a refrigerator keeps food cold.",
    "Describe a walk along a beach at sunset.",
    "List the steps to make a cup of tea, with a sentence on each.",
)
LOADS = (0, 1, 2)
BEFORE = "2 threads (torch's default)"
DEFAULT = "spectune's default (idle cores)"

# name: (environment before torch loads, --threads or None for spectune's default)
SETTINGS: dict[str, tuple[dict[str, str], int | None]] = {
    BEFORE: ({}, 2),
    "1 thread": ({}, 1),
    "2 threads, passive wait": ({"OMP_WAIT_POLICY": "PASSIVE"}, 2),
    "2 threads, spin 10k": ({"GOMP_SPINCOUNT": "10000"}, 2),
    "idle cores, spin 10k": ({"GOMP_SPINCOUNT": "10000"}, None),
    DEFAULT: ({}, None),
}
# What runs on every runtime and the server; the other candidates run on --candidates-on.
MAIN_SETTINGS = (BEFORE, "1 thread", DEFAULT)


@contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` processes that each keep one core busy."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(1.5 if count else 0.0)  # let the governor see them
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        time.sleep(1.5 if count else 0.0)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def child_decode(runtime: str, threads: int | None, tokens: int, repeats: int) -> None:
    """In a child: plain and speculative tokens/s at each load, one JSON line each."""
    import torch

    from spectune.cli.common import set_threads
    from spectune.control.base import FixedK
    from spectune.decode.engine import SpeculativeEngine
    from spectune.drafters.pairing import load_drafter_at, load_target_at
    from spectune.sampling import SamplingParams

    set_threads(threads)
    target = load_target_at("default", runtime)
    drafter = load_drafter_at("suffix", target, runtime)
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    engines = {
        "plain": (SpeculativeEngine(target.model), FixedK(0)),
        "speculative": (SpeculativeEngine(target.model, drafter), FixedK(2)),
    }
    for load in LOADS:
        with busy(load):
            for mode, (engine, policy) in engines.items():
                rates = []
                for _ in range(repeats):
                    gen = engine.run(prompt, params, policy=policy)
                    rates.append(len(gen.tokens) / gen.decode_time)
                print(
                    json.dumps(
                        {
                            "load": load,
                            "mode": mode,
                            "tokens_per_second": rates[1:] or rates,
                            "threads_after": torch.get_num_threads(),
                        }
                    ),
                    flush=True,
                )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stream_tokens(url: str, prompt: str, tokens: int) -> int:
    import httpx

    body = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    done = 0
    with httpx.Client(base_url=url, timeout=600) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[len("data: ") :])
                    if event.get("usage"):
                        done = int(event["usage"]["completion_tokens"])
    return done


def child_server(env: dict[str, str], threads: int | None, tokens: int, repeats: int) -> None:
    """In a child: start ``spectune serve`` and time 4 concurrent streaming clients."""
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "spectune", "serve", "--port", str(port)]
    command += ["--draft", "suffix", "--log-level", "warning"]
    if threads is not None:
        command += ["--threads", str(threads)]
    server = subprocess.Popen(command, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        for load in LOADS:
            with busy(load):
                rates = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    with ThreadPoolExecutor(len(SERVER_PROMPTS)) as pool:
                        done = sum(
                            pool.map(lambda p: stream_tokens(url, p, tokens), SERVER_PROMPTS)
                        )
                    rates.append(done / (time.perf_counter() - start))
                line = {"load": load, "mode": "server, 4 streams", "tokens_per_second": rates[1:]}
                print(json.dumps(line), flush=True)
    finally:
        server.terminate()
        server.wait(60)


def run_child(setting: str, runtime: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    env, threads = SETTINGS[setting]
    command = [sys.executable, __file__, "--child", setting, "--child-runtime", runtime]
    command += ["--tokens", str(args.tokens), "--repeats", str(args.repeats)]
    load_before = loadavg()
    out = subprocess.run(
        command, env={**os.environ, **env}, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"{setting} / {runtime} failed (exit {out.returncode})")
    rows = []
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            row.update(setting=setting, runtime=runtime, loadavg_before=load_before)
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, str, str, int], list[float]] = {}
    for row in rows:
        key = (row["runtime"], row["mode"], row["setting"], row["load"])
        cells.setdefault(key, []).extend(row["tokens_per_second"])
    lines = [
        "| runtime | decoding | setting | quiet | 1 busy | 2 busy |",
        "|---|---|---|---:|---:|---:|",
    ]
    for runtime, mode, setting in dict.fromkeys(k[:3] for k in cells):
        medians = [cells.get((runtime, mode, setting, load)) for load in LOADS]
        shown = [f"{statistics.median(m):.1f}" if m else "" for m in medians]
        lines.append(f"| {runtime} | {mode} | {setting} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtimes", default="int4,fp32,llamacpp")
    parser.add_argument(
        "--candidates-on", default="int4,llamacpp", help="runtimes that run every setting"
    )
    parser.add_argument("--server", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("docs/results/threads"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-runtime", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        env, threads = SETTINGS[args.child]
        if args.child_runtime == "server":
            child_server(env, threads, args.tokens, args.repeats)
        else:
            child_decode(args.child_runtime, threads, args.tokens, args.repeats)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    everything = set(args.candidates_on.split(","))
    jobs = [
        (s, r)
        for r in filter(None, args.runtimes.split(","))
        for s in (SETTINGS if r in everything else MAIN_SETTINGS)
    ]
    if args.server:
        jobs += [(s, "server") for s in MAIN_SETTINGS]
    rows: list[dict[str, Any]] = []
    print(f"load average at start: {loadavg():.2f}; {os.cpu_count()} CPUs", flush=True)
    for round_number in range(args.rounds):
        shift = round_number % len(jobs)
        for setting, runtime in jobs[shift:] + jobs[:shift]:
            found = run_child(setting, runtime, args)
            for row in found:
                print(json.dumps(row), flush=True)
            rows.extend(found)
            with (args.out / "threads.jsonl").open("w") as out:
                out.writelines(json.dumps(row) + "\n" for row in rows)
    (args.out / "threads.md").write_text(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
