"""Log, per greedy step, what the suffix draft and the model draft would each have kept
(both verified as one merged tree every step, K = 3 each, dev split, 3 prompts per
category, 64 tokens, 2 threads), for ``steps_analyse.py``.
Run from the repository root: python docs/results/hybrid-complement/steps.py fp32"""
import json, sys, torch
torch.set_num_threads(2)
from spectune.drafters.pairing import load_target, load_drafter
from spectune.drafters import hybrid as H
from spectune.bench.plan import load_bench_prompts
from spectune.decode.engine import SpeculativeEngine
from spectune.sampling import SamplingParams
from spectune.control.base import FixedK

dtype = sys.argv[1] if len(sys.argv) > 1 else "fp32"
K = 3
kw = {} if dtype == "fp32" else {"quantize": dtype}
t = load_target("default", **kw)
d = load_drafter("hybrid", t, **kw)
d.verify_cost = H.flat_verify
d.draft_cost = 0.0
d.merge_greedy = True
rows = []
orig_suggest = d.suffix.suggest
last = {}
def suggest(context, n):
    p = orig_suggest(context, n)
    last["p"] = p
    return p
d.suffix.suggest = suggest
orig_commit = H.HybridDrafter.commit
def commit(self, context, features):
    pend = self._pending
    if pend is not None and len(context) > pend.start:
        kept = context[pend.start:]
        p = last["p"]
        rows.append({
            "src": pend.source,
            "s_tokens": list(pend.suffix[0]), "s_probs": [float(x) for x in p.probs],
            "match": p.match_length, "where": p.source,
            "s_kept": H.kept_depth(*pend.suffix, kept) if pend.suffix[0] else 0,
            "m_tokens": list(pend.model[0]),
            "m_kept": H.kept_depth(*pend.model, kept) if pend.model[0] else 0,
            "chain": pend.suffix[1] is None,
        })
    orig_commit(self, context, features)
H.HybridDrafter.commit = commit
prompts = load_bench_prompts(t.tokenizer, split="dev", limit_per_category=3)
eng = SpeculativeEngine(t.model, d)
for bp in prompts:
    drafter = d
    for rec in eng.generate(list(bp.tokens), SamplingParams(max_tokens=64), policy=FixedK(K)):
        pass
    print(bp.id, len(rows), file=sys.stderr)
st = d.stats
json.dump({"rows": rows, "cost": st.measured_cost, "model_token_s": st.model_token_seconds,
           "target_s": st.target_step_seconds}, open(f"docs/results/hybrid-complement/steps-{dtype}-intel.json", "w"))
print("steps", len(rows), "c", st.measured_cost)
