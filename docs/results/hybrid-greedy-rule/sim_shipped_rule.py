"""The shipped greedy rule (chains only), then with a per-situation skip of the model:
skip where the measured gain of consulting the model (realized with - counterfactual
alone) is <= 0, exploring every Nth time."""
import sys
from collections import defaultdict
from sim import *
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[3] / "src"))
from spectune.drafters.hybrid import RateTable, model_keys, suffix_keys, right_depths, _chains, SURE_ENOUGH

def greedy(K, skip=False, explore=8, margin=0.0):
    R = RateTable()
    gain = {}
    seen = defaultdict(int)
    def p(s, fut, st):
        sd, sp = sug(s, K)
        src = s["src2"] if K <= 2 else s["src"]
        h = s["h"][:K]; conf = s["hp"][:K]
        akeys = suffix_keys(sp, src, "suffix")
        learn = [(akeys, sd)]
        opts = _chains(sd, R.chain(akeys), v, 0.0)
        alone = max(opts, default=None, key=lambda o: o.value)
        sit = akeys[0] if akeys else None
        if alone is not None:
            if R.rate(akeys[0]) >= SURE_ENOUGH:
                skip_now = True
            elif skip and sit in gain and gain[sit] <= margin:
                seen[sit] += 1
                skip_now = seen[sit] % explore != 0
            else:
                skip_now = False
            if skip_now:
                for keys, toks in learn:
                    for k_, r in right_depths(keys, toks, fut): R.observe(k_, r)
                return prefix(alone.tokens, fut) + 1, v(len(alone.tokens))
        agreement = "alone" if not sd else "agree" if sd[0] == h[0] else "differ"
        keys = model_keys(conf, agreement); learn.append((keys, h))
        sunk = len(h) * c
        me = R.chain(keys)
        opts = _chains(h, me, v, sunk)
        if agreement == "agree" and len(sd) > 1:
            first = R.rate(keys[0]); further = R.chain(akeys[1:])
            opts += _chains(sd, [first] + [first * (1 + e) for e in further], v, sunk)[1:]
        elif agreement == "differ":
            dk = suffix_keys(sp, src, "differ"); learn.append((dk, sd))
            opts += _chains(sd, R.chain(dk), v, sunk)
        best = max(opts, key=lambda o: o.value)
        a = prefix(best.tokens, fut)
        kept = fut[: a + 1]
        for keys_, toks in learn:
            for k_, r in right_depths(keys_, toks, kept): R.observe(k_, r)
        cost = v(len(best.tokens)) + sunk
        if alone is not None:
            with_ = (a + 1) / cost
            alone_v = (prefix(alone.tokens, kept) + 1) / v(len(alone.tokens))
            g = with_ - alone_v
            gain[sit] = g if sit not in gain else 0.95 * gain[sit] + 0.05 * g
        return a + 1, cost
    return p

print("head2 %.3f %.2f" % run(head(2))[:2], "suffix2 %.3f %.2f" % run(suffix(2))[:2], "hybrid-old2 %.3f %.2f" % run(hybrid(2))[:2])
a = run(greedy(2)); print(f"greedy        {a[0]:.3f}x {a[1]:.2f}")
for m in (0.0, 0.05, 0.1, 0.2):
    for ex in (4, 8, 16):
        a = run(greedy(2, True, ex, m)); print(f"greedy+skip m={m} explore={ex} {a[0]:.3f}x {a[1]:.2f}")
