"""llama-bench's tg64 rate against spectune's plain decoding of 64 tokens on its llama.cpp
backend, finely interleaved: each round runs one llama-bench repetition (after its own
warm-up) and one spectune decode, in ABBA order across rounds so neither system always
goes first, at THREADS threads for ROUNDS rounds. A third system, a minimal ctypes loop on
llama-cpp-python's C API (no spectune, no torch work), shows what any Python caller gets.

Prints every round and the median of the per-round ratios with a bootstrap 90% interval.

Run from the repository root with the venv active:
    PYTHONPATH=src MKL_CBWR=AVX2 LLAMA_BENCH=path/to/llama-bench \
        python docs/results/llamacpp/vs-llama-bench-paired.py THREADS ROUNDS
"""

import json
import os
import random
import statistics
import subprocess
import sys
import time

import llama_cpp
import numpy as np
import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.pairing import load_target
from spectune.models.loading import default_target_path
from spectune.sampling import SamplingParams

THREADS, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
GGUF = str(default_target_path())
BENCH = os.environ["LLAMA_BENCH"]
torch.set_num_threads(THREADS)
target = load_target("default", runtime="llamacpp")
engine = SpeculativeEngine(target.model, None)
prompt = target.tokenizer.encode("Once upon a time")


def spectune_rate() -> float:
    g = engine.run(prompt, SamplingParams(max_tokens=64), policy=FixedK(0))
    return len(g.tokens) / g.decode_time


class MinimalLoop:
    """llama_decode one token at a time through llama-cpp-python's ctypes API, greedy."""

    def __init__(self) -> None:
        lib = llama_cpp
        self.model = lib.llama_model_load_from_file(GGUF.encode(), lib.llama_model_default_params())
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 256, 512, 512
        params.n_threads = params.n_threads_batch = THREADS
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model, params)
        self.vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.batch = lib.llama_batch_init(1, 0, 1)

    def rate(self) -> float:
        lib, batch = llama_cpp, self.batch
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), False)
        token = prompt[0]
        start = time.perf_counter()
        for position in range(64):
            batch.n_tokens = 1
            batch.token[0], batch.pos[0] = token, position
            batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 1, 0, 1
            if lib.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            logits = np.ctypeslib.as_array(lib.llama_get_logits(self.ctx), shape=(self.vocab,))
            token = int(logits.argmax())
        return 64 / (time.perf_counter() - start)


def bench_rate() -> float:
    command = [BENCH, "-m", GGUF, "-t", str(THREADS), "-p", "0", "-n", "64", "-r", "1"]
    out = subprocess.run([*command, "-o", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def interval(ratios: list[float]) -> tuple[float, float]:
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return medians[100], medians[1899]


minimal = MinimalLoop()
systems = {"llama-bench": bench_rate, "spectune": spectune_rate, "minimal": minimal.rate}
for run in systems.values():  # warm up
    run()
rates: dict[str, list[float]] = {name: [] for name in systems}
for rnd in range(ROUNDS):
    order = list(systems) if rnd % 2 == 0 else list(reversed(systems))
    for name in order:
        rates[name].append(systems[name]())
    print(f"round {rnd}: " + " | ".join(f"{n} {rates[n][-1]:.1f}" for n in systems), flush=True)
for name in ("spectune", "minimal"):
    ratios = [b / s for b, s in zip(rates["llama-bench"], rates[name], strict=True)]
    low, high = interval(ratios)
    print(
        f"t={THREADS}: llama-bench/{name} median {statistics.median(ratios):.3f}x "
        f"(90% bootstrap interval {low:.3f}-{high:.3f}) over {ROUNDS} rounds; "
        f"median rates llama-bench {statistics.median(rates['llama-bench']):.1f}, "
        f"{name} {statistics.median(rates[name]):.1f} tokens/s"
    )
