"""Issue 13: speculation on llama.cpp, spectune's against llama.cpp's own, in one table.

Per prompt of the test split (one per category, chat template applied), greedy, 48 new
tokens, the same GGUF and thread count for every system, systems alternated prompt by
prompt so machine load falls on all of them alike:

- llama.cpp (C++) plain: ``llama-lookup --spec-draft-n-max 0`` (the same loop, no drafts);
- llama.cpp (C++) prompt lookup: ``llama-lookup --spec-draft-n-max 4`` (its n-gram lookup
  over the prompt and output: llama.cpp's own speculation that needs no draft model; no
  GGUF draft model shares SmolLM2's tokenizer, 135M being the family's smallest);
- spectune on its llama.cpp backend: plain, n-gram K = 4, suffix K = 4, suffix ``cost``.

Decode tokens/s (prefill excluded: llama-lookup's "decoded ... speed", spectune's
``Generation.decode_time``). Run: LLAMA_LOOKUP=path/to/llama-lookup python spec-table.py [threads]
(llama-lookup built from the llama.cpp that llama-cpp-python 0.3.36 vendors).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

import torch

from spectune.control import FixedK, make_policy
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.pairing import load_drafter, load_target
from spectune.models.loading import default_target_path
from spectune.prompts import load_prompts
from spectune.sampling import SamplingParams

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
TOKENS = 48
LOOKUP = os.environ["LLAMA_LOOKUP"]
torch.set_num_threads(THREADS)
target = load_target("default", runtime="llamacpp")
GGUF = str(default_target_path())  # the same file the backend loaded
prompts = load_prompts(split="test", limit_per_category=1)
prompts = [p for p in prompts if p.category != "code"]
drafters = {"ngram": load_drafter("ngram", target), "suffix": load_drafter("suffix", target)}
params = SamplingParams(max_tokens=TOKENS)
engine_plain = SpeculativeEngine(target.model, None)
engines = {name: SpeculativeEngine(target.model, d) for name, d in drafters.items()}


def cpp(text: str, n_max: int) -> float:
    out = (
        subprocess.run(
            [
                LOOKUP,
                "-m",
                GGUF,
                "-p",
                text,
                "-n",
                str(TOKENS),
                "-t",
                str(THREADS),
                "--spec-draft-n-max",
                str(n_max),
                "--temp",
                "0",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        + ""
    )
    match = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", out)
    assert match, out[-2000:]
    return int(match.group(1)) / float(match.group(2))


def spectune(name: str, ids: list[int], policy: object) -> float:
    engine = engine_plain if name == "plain" else engines[name]
    g = engine.run(ids, params, policy=policy)  # type: ignore[arg-type]
    return len(g.tokens) / g.decode_time


rates: dict[str, list[float]] = {}
engine_plain.run(prompts[0].tokens(target.tokenizer), SamplingParams(max_tokens=8))  # warm-up
for prompt in prompts:
    ids = prompt.tokens(target.tokenizer)
    text = target.tokenizer.hf.decode(ids)
    runs = (
        ("llama.cpp plain (C++ llama-lookup, n-max 0)", cpp, (text, 0)),
        ("llama.cpp prompt lookup (C++ llama-lookup, n-max 4)", cpp, (text, 4)),
        ("spectune on llama.cpp: plain", spectune, ("plain", ids, FixedK(0))),
        ("spectune on llama.cpp: ngram K=4", spectune, ("ngram", ids, FixedK(4))),
        ("spectune on llama.cpp: suffix K=4", spectune, ("suffix", ids, FixedK(4))),
        ("spectune on llama.cpp: suffix cost", spectune, ("suffix", ids, make_policy("cost"))),
    )
    for label, run, args in runs:
        rates.setdefault(label, []).append(run(*args))  # type: ignore[operator]
    print(prompt.id, {k: round(v[-1], 1) for k, v in rates.items()}, flush=True)

print(
    f"\n{len(prompts)} prompts, {TOKENS} tokens, greedy, {THREADS} thread(s); "
    "decode tokens/s (median over prompts)\n"
)
print("| system | tok/s | x its runtime's plain |\n|---|---:|---:|")
base = {
    "llama.cpp": statistics.median(rates["llama.cpp plain (C++ llama-lookup, n-max 0)"]),
    "spectune": statistics.median(rates["spectune on llama.cpp: plain"]),
}
for label, values in rates.items():
    med = statistics.median(values)
    ref = base["spectune" if label.startswith("spectune") else "llama.cpp"]
    print(f"| {label} | {med:.1f} | {med / ref:.2f}x |")
