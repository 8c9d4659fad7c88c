"""Issue 15: what a per-step choice between the suffix draft and the head's draft could
earn, from ``steps.py``'s rows (both drafts verified as one merged tree at every step, so
each one's kept depth is known at every step). Prices a step as the machine's verification
curve V[n] (a forward over n tokens over one token's; default: the 2-core Xeon's fp32 curve,
2 threads) plus k c for k head tokens (c = 0.07). Prints tokens per unit of target-step
time for fixed sources, merges, an oracle, a threshold on the suffix score, and per-bucket
(source x match length) estimates, in-sample and learned online.
Run: python steps_analyse.py steps-fp32-intel.json [V1,V2,... [c]]"""
import json, sys, itertools
D = json.load(open(sys.argv[1])); rows = [r for r in D["rows"]]
V = [None, 1.0, 1.0098, 1.1048, 1.5672, 1.6391, 1.6854, 1.8657, 1.9149, 1.965]  # fwd of n tokens
if len(sys.argv) > 2: V = [None] + [float(x) for x in sys.argv[2].split(",")]
c = float(sys.argv[3]) if len(sys.argv) > 3 else 0.07
print("steps", len(rows), "sources", {s: sum(r["src"] == s for r in rows) for s in ("suffix","model","both")})
def sfx(r, s):
    toks = r["s_tokens"][:s] if r["chain"] else []
    return toks, min(r["s_kept"], len(toks))
def mdl(r, k):
    toks = r["m_tokens"][:k]; return toks, min(r["m_kept"], len(toks))
def shared(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y: break
        n += 1
    return n
def run(choose):
    tok = tim = 0.0
    for r in rows:
        kept, nodes, k = choose(r)
        tok += kept + 1; tim += V[nodes + 1] + k * c
    return tok / tim, tok / len(rows)
def p_suffix(s):
    def f(r):
        t, kept = sfx(r, s); return kept, len(t), 0
    return f
def p_model(k):
    def f(r):
        t, kept = mdl(r, k); return kept, len(t), k
    return f
def p_merge(s, k):
    def f(r):
        ts, ks = sfx(r, s); tm, km = mdl(r, k)
        if not ts: return km, len(tm), k
        return max(ks, km), len(ts) + len(tm) - shared(ts, tm), k
    return f
def p_oracle(r):
    best = None
    for opt in [p_suffix(1)(r), p_suffix(2)(r), p_model(1)(r), p_model(2)(r), p_merge(1,1)(r), (0,0,0)]:
        kept, nodes, k = opt
        val = (kept + 1) / (V[nodes+1] + k*c)
        if best is None or val > best[0]: best = (val, opt)
    return best[1]
def p_rule(theta, s=2, k=2):
    def f(r):
        ts, _ = sfx(r, s)
        sc = sum(r["s_probs"][:len(ts)]) if ts else 0.0
        return p_suffix(s)(r) if ts and sc >= theta else p_model(k)(r)
    return f
for name, f in [("suffix1", p_suffix(1)), ("suffix2", p_suffix(2)), ("suffix3", p_suffix(3)),
                ("model1", p_model(1)), ("model2", p_model(2)), ("merge1+1", p_merge(1,1)),
                ("merge2+1", p_merge(2,1)), ("merge1+2", p_merge(1,2)), ("merge2+2", p_merge(2,2)), ("oracle", p_oracle)]:
    v, tps = run(f); print(f"{name:10s} value {v:.3f} tok/step {tps:.2f}")
for s, k in [(2,2),(2,1),(1,1)]:
    for th in [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2]:
        v, tps = run(p_rule(th, s, k)); print(f"rule s{s} k{k} theta {th}: value {v:.3f} tok/step {tps:.2f}")
import collections
def bucket(r):
    m = r["match"]; mb = 0 if m <= 1 else 1 if m == 2 else 2 if m <= 4 else 3 if m <= 8 else 4
    return (r["where"], mb)
# in-sample per-bucket expectation for s=1,2
E = collections.defaultdict(lambda: [0, 0.0, 0.0])
for r in rows:
    if r["s_tokens"] and r["chain"]:
        e = E[bucket(r)]; e[0] += 1; e[1] += sfx(r, 1)[1]; e[2] += sfx(r, 2)[1]
Em1 = sum(mdl(r,1)[1] for r in rows)/len(rows); Em2 = sum(mdl(r,2)[1] for r in rows)/len(rows)
mval = max((1+Em1)/(V[2]+c), (1+Em2)/(V[3]+2*c)); kbest = 1 if (1+Em1)/(V[2]+c) >= (1+Em2)/(V[3]+2*c) else 2
print("model value", round(mval,3), "k", kbest)
def p_bucket(r):
    if r["s_tokens"] and r["chain"]:
        n, e1, e2 = E[bucket(r)]
        v1, v2 = (1+e1/n)/V[2], (1+e2/n)/V[3]
        if max(v1, v2) >= mval:
            return p_suffix(1 if v1 > v2 else 2)(r)
    return p_model(kbest)(r)
v, tps = run(p_bucket); print(f"bucket rule (in-sample) value {v:.3f} tok/step {tps:.2f}")
# online version: running per-bucket means (decay 0.9 on newest? use simple running mean with prior)
def online(prior=0.4, w=0.1):
    est = {}
    tok = tim = 0.0
    for r in rows:
        if r["s_tokens"] and r["chain"]:
            b = bucket(r); e = est.get(b, [prior*0.5, prior])
            v1, v2 = (1+e[0])/V[2], (1+e[1])/V[3]
            if max(v1, v2) >= mval: kept, nodes, k = p_suffix(1 if v1 > v2 else 2)(r)
            else: kept, nodes, k = p_model(kbest)(r)
            # learn (suffix outcome visible in both cases, censored at kept+1)
            e = [e[0] + w*(sfx(r,1)[1]-e[0]), e[1] + w*(min(sfx(r,2)[1], kept+1)-e[1])]
            est[b] = e
        else:
            kept, nodes, k = p_model(kbest)(r)
        tok += kept+1; tim += V[nodes+1] + k*c
    return tok/tim
for w in (0.05, 0.1, 0.2): print("online w", w, round(online(w=w),3))
