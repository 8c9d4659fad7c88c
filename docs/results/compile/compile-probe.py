"""Issue 13 lead: torch.compile(dynamic=True) over the whole network, one forward of 1, 2 and 4
rows against eager, for int4 or fp32 (argv[1]); 200 cached tokens, two threads, medians of 30.
Run from the repository root: PYTHONPATH=src python docs/results/compile/compile-probe.py int4
"""

import time, torch, sys

torch.set_num_threads(2)
from spectune.drafters.pairing import load_target_at

prec = sys.argv[1]
t = load_target_at("default", prec)
m = t.model
net = m.net
cache = m.new_cache(1, 1024)
m.forward(torch.tensor([[1] * 200]), cache)


def bench(label):
    for rows in (1, 2, 4):
        x = torch.tensor([[42] * rows])
        ts = []
        for _ in range(30):
            t0 = time.perf_counter()
            m.forward(x, cache)
            ts.append(time.perf_counter() - t0)
            cache.truncate(cache.lengths[0] - rows)
        ts.sort()
        print(prec, label, rows, "rows median ms", round(1000 * ts[15], 2), flush=True)


bench("eager")
m.net = torch.compile(net, dynamic=True)
t0 = time.perf_counter()
m.forward(torch.tensor([[42]]), cache)
cache.truncate(cache.lengths[0] - 1)
m.forward(torch.tensor([[42] * 3]), cache)
cache.truncate(cache.lengths[0] - 3)
print("compile s", round(time.perf_counter() - t0, 1), flush=True)
bench("compiled")
m.net = net
bench("eager-again")
