"""Record, at every position of each test prompt's greedy output, the suffix proposal
(chain, cap 8, with corpus probabilities) and the head's 4-token greedy chain (with its
top probabilities); the engine decodes plainly (the recorder returns empty drafts)."""
import json, sys, time
import torch
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.draft import Draft
from spectune.drafters.pairing import load_drafter, load_target_at
from spectune.prompts import load_prompts
from spectune.sampling import SamplingParams
from spectune.control.crossover import curve_for_this_machine

precision = sys.argv[1]
out = sys.argv[2]
torch.set_num_threads(2)
target = load_target_at("default", precision)
hybrid = load_drafter("hybrid", target)
suffix, head = hybrid.suffix, hybrid.model
rows = []
import spectune.drafters.feature as F
_orig = F.process_logits
conf = []
def spy(logits, params):
    conf.append(float(logits.float().softmax(-1).max()))
    return _orig(logits, params)
F.process_logits = spy

class Recorder:
    name = "recorder"
    def reset(self):
        suffix.reset(); head.reset()
    def commit(self, context, features):
        suffix.commit(context, features); head.commit(context, features)
    def propose(self, context, k, params, generator):
        t0 = time.perf_counter()
        p = suffix.suggest(context, 8)
        t1 = time.perf_counter()
        p2 = suffix.suggest(context, 2)
        p4 = suffix.suggest(context, 4)
        conf.clear()
        d = head.propose(context, 4, params, generator)
        t2 = time.perf_counter()
        probs = d.probs
        top = [] if probs is None else probs.max(dim=-1).values.tolist()
        rows[-1]["steps"].append({
            "pos": len(context), "s": p.tokens, "sp": p.probs, "m": p.match_length, "src": p.source, "s2": p2.tokens, "sp2": p2.probs, "src2": p2.source, "s4": p4.tokens, "sp4": p4.probs,
            "h": d.tokens.tolist(), "hp": list(conf), "ts": t1 - t0, "th": t2 - t1,
        })
        return Draft(torch.zeros(0, dtype=torch.long), None)

curve = curve_for_this_machine(target.model)
prompts = load_prompts(split="test", limit_per_category=5)
eng = SpeculativeEngine(target.model, Recorder())
for pr in prompts:
    toks = pr.tokens(target.tokenizer)
    rows.append({"id": pr.id, "cat": pr.category, "prompt_len": len(toks), "steps": []})
    g = eng.run(toks, SamplingParams(max_tokens=48), policy=FixedK(4))
    rows[-1]["out"] = g.tokens if hasattr(g, "tokens") else g.output_tokens
    print(pr.category, len(rows[-1]["steps"]), flush=True)
json.dump({"curve": [list(range(0, 17)), [curve.relative(k) for k in range(0, 17)]], "rows": rows}, open(out, "w"))
