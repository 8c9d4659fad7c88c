"""Interleaved: per prompt, each drafter in turn (K=2, T=0), decode time per token; greedy equality checked."""
import sys, time, torch
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.pairing import load_drafter, load_target_at
from spectune.prompts import load_prompts
from spectune.sampling import SamplingParams
torch.set_num_threads(2)
target = load_target_at("default", sys.argv[1])
specs = sys.argv[3:]
k = int(sys.argv[2])
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))  # hybrid_old.py: see the README
import hybrid_old
from spectune.drafters.hybrid import HybridDrafter
def make(s):
    if s == "plain": return None
    if s == "hybrid-old":
        h = load_drafter("hybrid", target)
        return hybrid_old.HybridDrafter(h.suffix, h.model, merge_greedy=h.merge_greedy, verify_cost=h.verify_cost)
    if s == "hybrid-notree":
        h = load_drafter("hybrid", target)
        return HybridDrafter(h.suffix, h.model, merge_greedy=False, verify_cost=h.verify_cost)
    return load_drafter(s, target)
engines = {s: SpeculativeEngine(target.model, make(s)) for s in specs}
prompts = load_prompts(split="test", limit_per_category=5)
tot = {s: [0.0, 0, 0] for s in specs}
cat = {}
for p in prompts:
    toks = p.tokens(target.tokenizer)
    outs = {}
    for s in specs:
        g = engines[s].run(toks, SamplingParams(max_tokens=48), policy=FixedK(k) if s != "plain" else None)
        outs[s] = g.tokens
        tot[s][0] += g.decode_time; tot[s][1] += len(g.tokens); tot[s][2] += len(g.steps)
        c = cat.setdefault(p.category, {}).setdefault(s, [0.0, 0]); c[0] += g.decode_time; c[1] += len(g.tokens)
    assert all(o == outs["plain"] for o in outs.values()), p.id
plain = tot["plain"][0] / tot["plain"][1]
for s in specs:
    t, n, st = tot[s]
    print(f"{s:24s} {plain / (t / n):.3f}x  tok/step {n / st:.2f}  ", " ".join(f"{c[:5]}={ (v['plain'][0]/v['plain'][1]) / (v[s][0]/v[s][1]):.2f}" for c, v in cat.items()))
for s in specs:
    d = engines[s].drafter
    if d is not None and hasattr(d, "stats"):
        st = d.stats
        print(s, "suffix", st.suffix_steps, "model", st.model_steps, "merged", st.merged_steps, "c", st.measured_cost)
        print(sorted(((k, round(a / n, 2), round(n, 1)) for k, (a, n) in st.rates.counts.items()), key=str))
