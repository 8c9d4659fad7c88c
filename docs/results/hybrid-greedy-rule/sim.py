import json, sys, math
from collections import defaultdict
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[3] / "src"))
from spectune.drafters.hybrid import SourceStats, merge_trees, kept_depth

data = json.load(open(sys.argv[1]))
c = float(sys.argv[2])
V = data["curve"][1]
def v(d): return V[min(d, 16)]

def prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y: break
        n += 1
    return n

def run(policy):
    tot_tok = tot_cost = 0.0; steps = 0
    percat = defaultdict(lambda: [0.0, 0.0])
    stats = SourceStats()
    for row in data["rows"]:
        out = row["out"]; L0 = row["prompt_len"]
        by = {s["pos"]: s for s in row["steps"]}
        t = 0
        while t < len(out):
            s = by.get(L0 + t)
            if s is None:
                tok, cost = 1, 1.0
            else:
                tok, cost = policy(s, out[t:], stats)
                tok = min(tok, len(out) - t)
            t += tok; tot_tok += tok; tot_cost += cost; steps += 1
            percat[row["cat"]][0] += tok; percat[row["cat"]][1] += cost
    return tot_tok / tot_cost, tot_tok / steps, {k: a / b for k, (a, b) in percat.items()}

def sug(s, k):
    if k <= 2 and "s2" in s: return s["s2"][:k], s["sp2"][:k]
    if k <= 4 and "s4" in s: return s["s4"][:k], s["sp4"][:k]
    return s["s"][:k], s["sp"][:k]

def head(k):
    def p(s, fut, st):
        a = prefix(s["h"][:k], fut)
        return a + 1, v(k) + k * c
    return p

def suffix(k):
    def p(s, fut, st):
        d, _ = sug(s, k)
        if not d: return 1, 1.0
        return prefix(d, fut) + 1, v(len(d))
    return p

def hybrid(k, merge=True):
    def p(s, fut, st):
        sd, sp = sug(s, k)
        score = sum(sp); fp = sp[0] if sp else 0.0
        ch, mk = st.choose(score, fp, k, c, merge=merge, suffix_nodes=len(sd), verify=v)
        if sd and ch == "suffix":
            a = prefix(sd, fut); st.observe_suffix(a, score); return a + 1, v(len(sd))
        md = s["h"][:mk]
        if ch == "both" and sd:
            toks, par = merge_trees((md, None), (sd, None))
            a = kept_depth(toks, par, fut)
            sa = prefix(sd, fut); ma = prefix(md, fut)
            st.observe_suffix(sa, score)
            if sa == 0: st.observe_rescue(ma > 0)
            st.observe_model(ma, len(md))
            st.merged_steps += 1
            return a + 1, v(len(toks)) + mk * c
        a = prefix(md, fut); st.observe_model(a, len(md))
        return a + 1, v(mk) + mk * c
    return p

def oracle(k):
    def p(s, fut, st):
        best = (1.0, 1, 1.0)
        for kk in range(1, k + 1):
            a = prefix(s["h"][:kk], fut); cost = v(kk) + kk * c
            best = max(best, ((a + 1) / cost, a + 1, cost))
            sd, _ = sug(s, kk)
            if sd:
                a = prefix(sd, fut); cost = v(len(sd))
                best = max(best, ((a + 1) / cost, a + 1, cost))
        return best[1], best[2]
    return p

if __name__ == "__main__":
    print("curve", [round(x, 3) for x in V[:10]], "c", c)
    for name, pol in [("plain", lambda s, f, st: (1, 1.0))] + [(f"head{k}", head(k)) for k in (1, 2, 3, 4)] + [(f"suffix{k}", suffix(k)) for k in (2, 4, 8)] + [(f"hybrid{k}", hybrid(k)) for k in (2, 4)] + [(f"hybridnomerge{k}", hybrid(k, False)) for k in (2, 4)] + [(f"oracle{k}", oracle(k)) for k in (2, 4, 8)]:
        sp, tps, pc = run(pol)
        print(f"{name:16s} {sp:.3f}x tok/step {tps:.2f} ", " ".join(f"{k[:5]}={x:.2f}" for k, x in sorted(pc.items())))
