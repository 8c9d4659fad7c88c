"""Issue 13 lead: the compiled int4 network meets chunks of 1..9 rows: first-call seconds (a
compile) and medians. Variant A compiles everything (the row-exact attention loop unrolls
per row count); B leaves RowKeys.attend eager (a graph break per layer).
Run: PYTHONPATH=src python docs/results/compile/compile-rows.py A|B
"""

import time, torch, sys

torch.set_num_threads(2)
import spectune.models.llama as L

variant = sys.argv[1]
if variant == "B":
    L.RowKeys.attend = torch.compiler.disable(L.RowKeys.attend)
from spectune.drafters.pairing import load_target_at

t = load_target_at("default", "int4")
m = t.model
net = m.net
cache = m.new_cache(1, 1024)
m.forward(torch.tensor([[1] * 200]), cache)
m.net = torch.compile(net, dynamic=True)
for rows in (1, 2, 3, 4, 5, 6, 9):
    x = torch.tensor([[42] * rows])
    t0 = time.perf_counter()
    m.forward(x, cache)
    cache.truncate(cache.lengths[0] - rows)
    first = time.perf_counter() - t0
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        m.forward(x, cache)
        ts.append(time.perf_counter() - t0)
        cache.truncate(cache.lengths[0] - rows)
    ts.sort()
    print(
        variant, rows, "first s", round(first, 1), "median ms", round(1000 * ts[10], 2), flush=True
    )
