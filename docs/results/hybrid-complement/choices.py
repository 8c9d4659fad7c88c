"""How often the hybrid (fp32, K = 2, r5 head) picks each source: 14 dev-split prompts,
48 tokens, 2 threads; prints its learned statistics. Run: PYTHONPATH=src python docs/results/hybrid-complement/choices.py
2026-12-04, Intel Xeon: suffix_steps 374, model_steps 24, merged_steps 9, suffix calibration 0.82,
model rates 0.38 / 0.46, measured c 0.071 (its catch-up forwards after suffix steps included)."""
import sys, torch
torch.set_num_threads(2)
from spectune.drafters.pairing import load_target, load_drafter
from spectune.bench.plan import load_bench_prompts
from spectune.decode.engine import SpeculativeEngine
from spectune.sampling import SamplingParams
from spectune.control.base import FixedK
t = load_target("default")
d = load_drafter("hybrid", t)
print("merge_greedy", d.merge_greedy, "verify", [round(d.verify_cost(n),3) for n in range(1,6)])
prompts = load_bench_prompts(t.tokenizer, split="dev", limit_per_category=2)
eng = SpeculativeEngine(t.model, d)
for bp in prompts:
    for rec in eng.generate(list(bp.tokens), SamplingParams(max_tokens=48), policy=FixedK(2)):
        pass
st = d.stats
print({k: getattr(st, k) for k in ("suffix_calibration","model_rates","model_rescue","suffix_steps","model_steps","merged_steps","suffix_accepted_total","model_accepted_total")}, "c", st.measured_cost)
