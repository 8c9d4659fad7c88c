"""How the hybrid chooses at T = 0 on fp32 with the stage-7 head: steps per source, the
suffix calibration (mean of accepted/score) against the ratio of sums, accepted by score band."""
from collections import defaultdict

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import hybrid as hybrid_module
from spectune.drafters.pairing import load_drafter, load_target
from spectune.prompts import load_prompts
from spectune.sampling import SamplingParams

pairs = []
orig = hybrid_module.SourceStats.observe_suffix


def spy(self, accepted, score):
    pairs.append((accepted, score))
    return orig(self, accepted, score)


hybrid_module.SourceStats.observe_suffix = spy
target = load_target("default")
drafter = load_drafter("hybrid", target)
prompts = load_prompts(split="test", limit_per_category=3)
for p in prompts:
    engine = SpeculativeEngine(target.model, drafter)
    engine.run(p.tokens(target.tokenizer), SamplingParams(max_tokens=48), policy=FixedK(2))
stats = drafter.stats
print("suffix steps", stats.suffix_steps, "model steps", stats.model_steps, "merged", stats.merged_steps)
print("suffix accepted/step", stats.suffix_accepted_total / max(stats.suffix_steps, 1),
      "model accepted/step", stats.model_accepted_total / max(stats.model_steps, 1))
print("calibration (mean of ratios, decayed)", round(stats.suffix_calibration, 3),
      "ratio of sums", round(sum(a for a, _ in pairs) / sum(s for _, s in pairs), 3))
print("model rates", [round(r, 3) for r in stats.model_rates[:3]], "cost", stats.measured_cost)
bands = defaultdict(lambda: [0, 0.0, 0])
for a, s in pairs:
    b = min(int(s * 4) / 4, 2.0)
    bands[b][0] += a; bands[b][1] += s; bands[b][2] += 1
for b in sorted(bands):
    a, s, n = bands[b]
    print(f"score band {b:.2f}: n={n} accepted/step={a/n:.2f} score/step={s/n:.2f} ratio={a/s if s else 0:.2f}")
