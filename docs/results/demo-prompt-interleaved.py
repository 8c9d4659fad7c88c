"""The `make demo` prompt on int4, interleaved over four rounds: plain decoding, and the
suffix drafter at K = 0, under `cost` and at K = 2 (decode tokens/s, 96 tokens at most).

Run: PYTHONPATH=src MKL_CBWR=AVX2 python docs/results/demo-prompt-interleaved.py
"""

import statistics

import torch

from spectune.control.base import FixedK
from spectune.control.crossover import verify_curve_of
from spectune.control.registry import make_policy
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.pairing import load_drafter_at, load_target_at
from spectune.sampling import SamplingParams

torch.set_num_threads(2)
target = load_target_at("default", "int4")
suffix = load_drafter_at("suffix", target, "int4")
question = "Explain in three sentences why the sky is blue."
prompt = target.tokenizer.encode_chat([{"role": "user", "content": question}])
plain, spec = SpeculativeEngine(target.model, None), SpeculativeEngine(target.model, suffix)
params = SamplingParams(max_tokens=96)
curve = verify_curve_of(target.model)
runs = {
    "plain": lambda: plain.run(prompt, params, policy=FixedK(0)),
    "suffix K=0": lambda: spec.run(prompt, params, policy=FixedK(0)),
    "suffix cost": lambda: spec.run(prompt, params, policy=make_policy("cost", cost_curve=curve)),
    "suffix K=2": lambda: spec.run(prompt, params, policy=FixedK(2)),
}
for run in runs.values():  # warm up
    run()
rates: dict[str, list[float]] = {name: [] for name in runs}
for _ in range(4):
    for name, run in runs.items():
        g = run()
        rates[name].append(len(g.tokens) / g.decode_time)
for name, values in rates.items():
    print(name, round(statistics.median(values), 1), [round(x, 1) for x in values])
