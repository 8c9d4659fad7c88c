"""How close a runtime's next-token distributions are to fp32's (the dequantised GGUF):
fp32 greedily continues the first N test prompts of each category by 64 tokens; each
runtime then scores prompt + continuation in one forward, and per continuation position we
compare with fp32: top-1 agreement and KL(fp32 || runtime), in nats.

Usage: MKL_CBWR=AVX2 python docs/results/bench-onednn-head-int4/fidelity.py int4 [N=3]
"""

import sys

import torch
import torch.nn.functional as F

from spectune.drafters.pairing import load_target_at
from spectune.prompts import load_prompts

torch.set_num_threads(2)
precision = sys.argv[1]
per_category = int(sys.argv[2]) if len(sys.argv) > 2 else 3
NEW_TOKENS = 64

reference = load_target_at("default", "fp32")
runtime = load_target_at("default", precision)


def scored(model, tokens: list[int], start: int) -> torch.Tensor:
    cache = model.new_cache(1, capacity=len(tokens) + 1)
    return model.forward(torch.tensor([tokens]), cache).logits[0, start - 1 : -1].float()


agree = positions = 0
divergence = 0.0
with torch.no_grad():
    for prompt in load_prompts(split="test", limit_per_category=per_category):
        ids = prompt.tokens(reference.tokenizer)
        cache = reference.model.new_cache(1, capacity=len(ids) + NEW_TOKENS + 1)
        logits = reference.model.forward(torch.tensor([ids]), cache).logits
        continuation = []
        for _ in range(NEW_TOKENS):
            continuation.append(int(logits[0, -1].argmax()))
            logits = reference.model.forward(torch.tensor([continuation[-1:]]), cache).logits
        tokens = ids + continuation
        want = scored(reference.model, tokens, len(ids))
        got = scored(runtime.model, tokens, len(ids))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        divergence += float(
            F.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="sum")
        )
        positions += NEW_TOKENS
print(
    f"{precision}: {positions} positions, top-1 agreement with fp32 {agree / positions:.3f}, "
    f"KL(fp32 || {precision}) {divergence / positions:.5f} nats"
)
