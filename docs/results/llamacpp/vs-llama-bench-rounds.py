"""llama-bench's tg64 rate alternated with spectune's plain decoding of 64 tokens on its
llama.cpp backend, at 1 and 2 threads, for ROUNDS rounds (argv[1], default 6).

Run from the repository root with the venv active:
    PYTHONPATH=src MKL_CBWR=AVX2 LLAMA_BENCH=path/to/llama-bench \
        python docs/results/llamacpp/vs-llama-bench-rounds.py 6
"""

import json
import os
import statistics
import subprocess
import sys

import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.pairing import load_target
from spectune.models.loading import default_target_path
from spectune.sampling import SamplingParams

GGUF = str(default_target_path())
BENCH = os.environ["LLAMA_BENCH"]


def spectune_rate(threads: int) -> tuple[float, list[float]]:
    torch.set_num_threads(threads)
    cpp = load_target("default", runtime="llamacpp")
    engine = SpeculativeEngine(cpp.model, None)
    prompt = cpp.tokenizer.encode("Once upon a time")
    engine.run(prompt, SamplingParams(max_tokens=16), policy=FixedK(0))
    runs = [engine.run(prompt, SamplingParams(max_tokens=64), policy=FixedK(0)) for _ in range(3)]
    rates = [len(g.tokens) / g.decode_time for g in runs]
    return statistics.fmean(rates), rates


def bench_rate(threads: int) -> float:
    command = [
        BENCH,
        "-m",
        GGUF,
        "-t",
        str(threads),
        "-p",
        "0",
        "-n",
        "64",
        "-r",
        "3",
        "-o",
        "json",
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


ratios: dict[int, list[float]] = {1: [], 2: []}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    for t in (1, 2):
        b = bench_rate(t)
        s, runs = spectune_rate(t)
        ratios[t].append(b / s)
        print(
            f"round {rnd} t={t}: llama-bench {b:.1f} | spectune {s:.1f} "
            f"{[round(x, 1) for x in runs]} | llama-bench/spectune {b / s:.2f}x",
            flush=True,
        )
for t, values in ratios.items():
    print(
        f"t={t}: median llama-bench/spectune {statistics.median(values):.2f}x over "
        f"{len(values)} rounds; all {[round(r, 2) for r in values]}"
    )
