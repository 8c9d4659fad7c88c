import sys
from sim import *  # noqa: F403
from collections import defaultdict

class Bins:
    """running acceptance rate per key, prior 0.5 (pseudo-count 2)"""
    def __init__(self): self.a = defaultdict(lambda: 1.0); self.n = defaultdict(lambda: 2.0)
    def rate(self, k): return self.a[k] / self.n[k]
    def see(self, k, hit): self.a[k] += hit; self.n[k] += 1

def pband(p): return min(int(p * 5), 4)

def hc(K, skip_thr=0.95, decay=None):
    B = Bins()
    def p(s, fut, st):
        sd, sp = sug(s, K)
        src = s["src2"] if K <= 2 else s["src"]
        h, hp = s["h"], s["hp"]
        opts = []
        if sd:
            ks = ("s1", src, pband(sp[0]))
            q1 = B.rate(ks)
            if q1 >= skip_thr:  # suffix without the head
                a = prefix(sd, fut)
                B.see(ks, a > 0)
                return a + 1, v(len(sd))
        # head token 1
        kh = ("h1", pband(hp[0]))
        ph1 = B.rate(kh)
        agree = bool(sd) and sd[0] == h[0]
        hit1 = h[0] == fut[0]
        B.see(kh, hit1)
        if sd: B.see(("s1", src, pband(sp[0])), sd[0] == fut[0])
        if agree:
            ka = ("agree", src, pband(sp[0])); pa = B.rate(ka); B.see(ka, hit1)
            # continuation: suffix tokens (free) vs head token 2
            if len(sd) >= 2:
                k2 = ("s2|agree", pband(sp[1] / sp[0])); q2 = B.rate(k2)
                e_s = pa * (1 + q2); val_s = (1 + e_s) / (v(2) + c)
                kh2 = ("h2", pband(hp[1])); e_h = pa * (1 + B.rate(kh2)); val_h = (1 + e_h) / (v(2) + 2 * c)
                val_1 = (1 + pa) / (v(1) + c)
                if hit1 and len(fut) > 1: B.see(k2, sd[1] == fut[1])
                best = max(val_s, val_h, val_1)
                if best == val_s: return prefix(sd[:2], fut) + 1, v(2) + c
                if best == val_1: return prefix(h[:1], fut) + 1, v(1) + c
                if hit1 and len(fut) > 1: B.see(kh2, h[1] == fut[1])
                return prefix(h[:2], fut) + 1, v(2) + 2 * c
            ph1 = pa
        # head chain 1 or 2
        kh2 = ("h2", pband(hp[1]))
        ph2 = B.rate(kh2)
        val1 = (1 + ph1) / (v(1) + c)
        val2 = (1 + ph1 * (1 + ph2)) / (v(2) + 2 * c)
        cands = [(val1, "h1"), (val2, "h2")]
        if sd and not agree:
            kd = ("s1|dis", src, pband(sp[0])); qd = B.rate(kd)
            B.see(kd, sd[0] == fut[0])
            # sibling: {h1, s1} (+h2 under h1)
            cands.append(((1 + ph1 + qd) / (v(2) + c), "sib1"))
            cands.append(((1 + ph1 * (1 + ph2) + qd) / (v(3) + 2 * c), "sib2"))
        best = max(cands)[1]
        if best == "h1": return prefix(h[:1], fut) + 1, v(1) + c
        if hit1 and len(fut) > 1: B.see(kh2, h[1] == fut[1])
        if best == "h2": return prefix(h[:2], fut) + 1, v(2) + 2 * c
        if best == "sib1":
            toks, par = merge_trees((h[:1], None), (sd[:1], None)); return kept_depth(toks, par, fut) + 1, v(2) + c
        toks, par = merge_trees((h[:2], None), (sd[:1], None)); return kept_depth(toks, par, fut) + 1, v(3) + 2 * c
    return p

print("head2 %.3f %.2f" % run(head(2))[:2], "hybrid2 %.3f %.2f" % run(hybrid(2))[:2], "suffix2 %.3f %.2f" % run(suffix(2))[:2])
for thr in (0.8, 0.9, 0.95, 1.01):
    a = run(hc(2, thr))
    print(f"hc thr={thr} {a[0]:.3f}x {a[1]:.2f}", " ".join(f"{kk[:5]}={x:.2f}" for kk, x in sorted(a[2].items())))
