"""Acceptance by situation from a record.py recording: the head's first and second token by its own
probability's decile; the suffix's first token (cap-8 proposal) by (same first token as the head,
source, corpus-probability band). Usage: analyse.py RECORDING.json"""
import json, sys
from collections import defaultdict
d = json.load(open(sys.argv[1]))
def prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y: break
        n += 1
    return n
H = defaultdict(lambda: [0, 0]); S = defaultdict(lambda: [0, 0]); H2 = defaultdict(lambda: [0, 0]); S2 = defaultdict(lambda: [0,0])
for r in d["rows"]:
    out = r["out"]; L0 = r["prompt_len"]
    for s in r["steps"]:
        t = s["pos"] - L0; fut = out[t:]
        if not fut: continue
        h, hp = s["h"], s["hp"]
        if h:
            b = min(int(hp[0] * 10), 9); H[b][0] += h[0] == fut[0]; H[b][1] += 1
            if len(h) > 1 and len(fut) > 1 and h[0] == fut[0]:
                b = min(int(hp[1] * 10), 9); H2[b][0] += h[1] == fut[1]; H2[b][1] += 1
        if s["s"]:
            agree = bool(h) and h[0] == s["s"][0]
            b = (agree, s["src"], min(int(s["sp"][0] * 5), 4)); S[b][0] += s["s"][0] == fut[0]; S[b][1] += 1
            if agree:
                b2 = min(int(hp[0]*10), 9); S2[b2][0] += s["s"][0] == fut[0]; S2[b2][1] += 1
print("head first by hp1 decile:", {k: (round(a / n, 2), n) for k, (a, n) in sorted(H.items())})
print("head second | first kept, by hp2 decile:", {k: (round(a / n, 2), n) for k, (a, n) in sorted(H2.items())})
for k, (a, n) in sorted(S.items()):
    print("suffix first", k, round(a / n, 2), n)
print("agree by hp", {k: (round(a / n, 2), n) for k, (a, n) in sorted(S2.items())})
