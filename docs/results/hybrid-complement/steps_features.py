"""Issue 15: the suffix draft's and the head's first-token acceptance by what the suffix
lookup knows (where it matched, match length, the corpus probability of its first token),
from ``steps.py``'s rows. Run: python steps_features.py steps-fp32-intel.json"""
import json, sys, collections
rows = json.load(open(sys.argv[1]))["rows"]
b = collections.defaultdict(lambda: [0,0,0,0.0])
for r in rows:
    if not r["s_tokens"] or not r["chain"]: continue
    m = r["match"]; mb = "1" if m <= 1 else "2" if m == 2 else "3-4" if m <= 4 else "5-8" if m <= 8 else "9+"
    p1 = r["s_probs"][0]; pb = f"{min(int(p1*5),4)/5:.1f}"
    for key in [("where", r["where"]), ("match", mb), ("p1", pb)]:
        x = b[key]; x[0] += 1; x[1] += r["s_kept"] > 0; x[2] += r["m_kept"] > 0; x[3] += r["s_kept"]
for k in sorted(b):
    n, s1, m1, sk = b[k]; print(k, n, f"suffix first {s1/n:.2f}  model first {m1/n:.2f}  suffix mean kept {sk/n:.2f}")
