#!/bin/bash
# Issue 13: llama-bench tg rate against spectune's plain decoding on its llama.cpp backend, same file, 1 and 2 threads, alternated.
GGUF=$(PYTHONPATH=src python -c "from spectune.models.loading import default_target_path; print(default_target_path())")  # the default target
B=${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench built from the llama.cpp that llama-cpp-python 0.3.36 vendors}
cd "$(git rev-parse --show-toplevel)"  # run with the venv active
for t in 1 2; do
 for round in 1 2; do
  $B -m $GGUF -t $t -p 0 -n 64 -r 3 -o json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('llama-bench t=$t', [round(x['avg_ts'],1) for x in d])"
  PYTHONPATH=src MKL_CBWR=AVX2 python - $t <<'PY'
import sys, time, torch
t=int(sys.argv[1]); torch.set_num_threads(t)
from spectune.drafters.pairing import load_target
from spectune.decode.engine import SpeculativeEngine
from spectune.control.base import FixedK
from spectune.sampling import SamplingParams
cpp = load_target("default", runtime="llamacpp")
eng = SpeculativeEngine(cpp.model, None)
prompt = cpp.tokenizer.encode("Once upon a time")
eng.run(prompt, SamplingParams(max_tokens=16), policy=FixedK(0))
rates=[]
for r in range(3):
    g = eng.run(prompt, SamplingParams(max_tokens=64), policy=FixedK(0))
    rates.append(len(g.tokens)/g.decode_time)
print(f"spectune llamacpp plain t={t}", [round(x,1) for x in rates], "tokens", len(g.tokens))
PY
 done
done
