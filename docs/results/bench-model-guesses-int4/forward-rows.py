"""One target forward over 1, 2, 3, 4 and 6 tokens after a prompt (median of 30, twice),
and with a second argument a torch profile of the 1- and 3-token forwards by operator.
A compiled runtime (``int4+compile``) times 1, 2 and 3 tokens, their graphs compiled first.

Usage: MKL_CBWR=AVX2 python docs/results/bench-model-guesses-int4/forward-rows.py int4 [prof]
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from spectune.drafters.pairing import load_target_at

torch.set_num_threads(2)
precision = sys.argv[1] if len(sys.argv) > 1 else "int4"
target = load_target_at("default", precision)
model = target.model
chunks = (1, 2, 3, 4, 6)
if precision.endswith("+compile"):
    chunks = (1, 2, 3)
    model.compile_chunks(chunks[-1])
chat = [{"role": "user", "content": "Explain in three sentences why the sky is blue."}]
prompt = torch.tensor([target.tokenizer.encode_chat(chat)])


def after_prompt() -> object:
    cache = model.new_cache(1, capacity=512)
    model.forward(prompt, cache)
    return cache


def median_ms(chunk: int, n: int = 30) -> float:
    cache = after_prompt()
    tokens = torch.full((1, chunk), 300, dtype=torch.long)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        model.forward(tokens, cache)
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2] * 1e3


for _ in range(2):
    print([(chunk, round(median_ms(chunk), 2)) for chunk in chunks], flush=True)
if len(sys.argv) > 2:
    for chunk in (1, 3):
        cache = after_prompt()
        tokens = torch.full((1, chunk), 300, dtype=torch.long)
        for _ in range(3):
            model.forward(tokens, cache)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                model.forward(tokens, cache)
        print(chunk)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
