"""Suffix lookup cost per drafting step (SuffixDrafter.suggest, K = 4), warm and cold.

Feeds the corpus's held-out answers (in no shipped index; before 2026-12-04 the script fed
shard 37, which the 58-shard index now holds) token pair by token pair through a suffix
drafter, with the shipped index and with server histories of two sizes.
"cold": a 100 MB array is summed before each lookup, as a target forward does to the
caches; that is what a lookup costs inside the engine.

    PYTHONPATH=src .venv/bin/python docs/results/suffix-lookup/lookup-cost.py
"""

import time

import numpy as np
from pathlib import Path

from spectune.distill.corpus import read_answers
from spectune.drafters.pairing import shipped_suffix_index
from spectune.drafters.suffix import SuffixDrafter
from spectune.drafters.suffix_history import HistoryStore
from spectune.drafters.suffix_index import SuffixIndex

index = SuffixIndex.load(shipped_suffix_index("smollm2"))
held = list(read_answers(Path("corpus/smollm2-135m-instruct"), split="heldout"))
docs = [np.array(a.prompt + a.answer) for a in held]
prompts = [len(a.prompt) for a in held]
sweep = np.ones(25_000_000, np.float32)  # 100 MB


def run(drafter: SuffixDrafter, label: str, cold: bool) -> None:
    times = []
    for doc, prompt in zip(docs[:40], prompts[:40], strict=True):
        drafter.reset()
        ids = doc.tolist()
        for n in range(int(prompt), len(ids), 2):
            if cold:
                sweep.sum()
            start = time.perf_counter()
            drafter.suggest(ids[:n], 4)
            times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    print(
        f"{label:34s} {'cold' if cold else 'warm'}  steps {ms.size}  mean {ms.mean():.3f} ms"
        f"  p99 {np.percentile(ms, 99):.3f} ms"
    )


def history(copies: int) -> HistoryStore:
    store = HistoryStore()
    for copy in range(copies):
        for i, doc in enumerate(docs[60:]):
            store.add(copy * 1000 + i, doc)
    return store


for cold in (False, True):
    run(SuffixDrafter(None), "context only", cold)
    run(SuffixDrafter(index), "context + shipped index", cold)
    small = history(1)
    run(SuffixDrafter(index, small), f"... + history ({small.num_tokens} tokens)", cold)
    full = history(6)
    run(SuffixDrafter(index, full), f"... + history ({full.num_tokens} tokens)", cold)
