import sys, statistics as st
from collections import defaultdict
import torch
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.pairing import load_drafter, load_target_at
from spectune.prompts import load_prompts
from spectune.sampling import SamplingParams
torch.set_num_threads(2)
target = load_target_at("default", sys.argv[1])
prompts = load_prompts(split="test", limit_per_category=2)
for spec in sys.argv[2:]:
    drafter = load_drafter(spec, target) if spec != "plain" else None
    eng = SpeculativeEngine(target.model, drafter)
    by = defaultdict(list); draft = []; other = []; tot = [0.0, 0]
    for rep in range(2):
        for p in prompts:
            g = eng.run(p.tokens(target.tokenizer), SamplingParams(max_tokens=48), policy=FixedK(2) if drafter else None)
            if rep == 0: continue
            for r in g.steps:
                by[(r.num_draft_tokens, r.tree_depth is not None)].append(r.target_time)
                draft.append(r.draft_time); other.append(r.step_time - r.target_time - r.draft_time)
                tot[0] += r.step_time; tot[1] += len(r.emitted)
    print(spec, "ms/token %.2f" % (1000 * tot[0] / tot[1]), "draft ms %.2f other ms %.2f" % (1000 * st.mean(draft), 1000 * st.mean(other)))
    for k in sorted(by):
        print("   nodes", k, "n", len(by[k]), "target ms %.2f" % (1000 * st.median(by[k])))
