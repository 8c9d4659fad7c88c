"""One compiled int4 forward (``int4+compile``) over 1, 2 and 3 tokens after a prompt,
median of 30, twice; graphs compiled before timing.

Usage: MKL_CBWR=AVX2 python docs/results/bench-onednn-head-int4/compiled-rows.py
"""

import time

import torch

from spectune.drafters.pairing import load_target_at

torch.set_num_threads(2)
target = load_target_at("default", "int4+compile")
model = target.model
model.compile_chunks(3)
chat = [{"role": "user", "content": "Explain in three sentences why the sky is blue."}]
prompt = torch.tensor([target.tokenizer.encode_chat(chat)])


def median_ms(chunk: int, n: int = 30) -> float:
    cache = model.new_cache(1, capacity=512)
    model.forward(prompt, cache)
    tokens = torch.full((1, chunk), 300, dtype=torch.long)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        model.forward(tokens, cache)
        times.append(time.perf_counter() - start)
    return round(sorted(times)[n // 2] * 1e3, 2)


for _ in range(2):
    print([(chunk, median_ms(chunk)) for chunk in (1, 2, 3)], flush=True)
