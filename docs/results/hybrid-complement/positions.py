"""Issue 15: where the suffix drafter and the shipped head each guess the next token right.

Greedy int4 continuations of the test split (PER_CATEGORY prompts a category, TOKENS new
tokens); at every position of each continuation: the suffix drafter's first token (shipped
index, the request's own context), its corpus probability and match length; the head's top
token and its probability (softmax at T = 1, teacher-forced on the target's states); the
target's token. Writes OUT (JSON rows), read by ``analyse.py``.

Run from the repository root: PYTHONPATH=src python docs/results/hybrid-complement/positions.py 5 96 OUT
"""

import json
import sys

import torch

from spectune.drafters.pairing import load_drafter_at, load_target_at
from spectune.prompts import load_prompts
from spectune.sampling import SamplingParams
from spectune.select.alpha import make_continuations, restate

per_category, tokens, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(2)
target = load_target_at("default", "int4")
head = load_drafter_at("smollm2-draft", target, "int4")
suffix = load_drafter_at("suffix", target, "int4")
chosen = load_prompts(split="test", limit_per_category=per_category)
prompts = [(p.id, p.category, p.tokens(target.tokenizer)) for p in chosen]
continuations = restate(target.model, make_continuations(target.model, prompts, tokens))
rows = []
for item in continuations:
    head_rows = head.score_sequence(  # type: ignore[union-attr]
        item.tokens, item.hidden, SamplingParams(temperature=1.0, max_tokens=1)
    )
    for position in item.scored:
        context = list(item.tokens[: position + 1])
        suffix.reset()  # type: ignore[union-attr]
        suffix.commit(context, None)  # type: ignore[union-attr]
        guess = suffix.suggest(context, 1)  # type: ignore[union-attr]
        top = int(head_rows[position].argmax())
        rows.append(
            {
                "category": item.category,
                "target": item.tokens[position + 1],
                "suffix": guess.tokens[0] if guess.tokens else None,
                "suffix_prob": guess.probs[0] if guess.tokens else 0.0,
                "match_length": guess.match_length,
                "head": top,
                "head_prob": float(head_rows[position][top]),
            }
        )
with open(out, "w") as f:
    json.dump(rows, f)
print(len(rows), "positions")
