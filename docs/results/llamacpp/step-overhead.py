"""Issue 13: spectune's work per plain step outside the target forward on llama.cpp: the
sum of step times minus target times over 64-token decodes, four runs.

Run: PYTHONPATH=src MKL_CBWR=AVX2 python docs/results/llamacpp/step-overhead.py THREADS
"""

import sys

import torch

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.pairing import load_target
from spectune.sampling import SamplingParams

torch.set_num_threads(int(sys.argv[1]))
cpp = load_target("default", runtime="llamacpp")
engine = SpeculativeEngine(cpp.model, None)
prompt = cpp.tokenizer.encode("Once upon a time")
engine.run(prompt, SamplingParams(max_tokens=64), policy=FixedK(0))
for _ in range(4):
    g = engine.run(prompt, SamplingParams(max_tokens=64), policy=FixedK(0))
    target = sum(s.target_time for s in g.steps)
    outside = (g.decode_time - target) / len(g.steps)
    print(f"{len(g.steps)} steps: {outside * 1e3:.3f} ms a step outside the target forward")
