"""Issue 13 lead: torch.compile on the native runtime, measured against eager.

Modes (argv[1]); 200 cached tokens, two threads, medians of 20-30 forwards:

- ``whole PRECISION``: the whole network compiled (dynamic=True), one forward of 1, 2 and 4
  rows, eager before and after.
- ``rows``: int4, the whole network compiled, chunks of 1-9 rows: first-call seconds (a
  compile: the row-exact attention loop unrolls per row count) and medians.
- ``rows-attend-eager``: the same with ``RowKeys.attend`` left eager (a graph break a layer).
- ``pieces``: int4, only the pieces around an eager attention compiled (norm, q/k/v and
  rotary; o_proj and the MLP), so one graph would serve every row count.

Run from the repository root: PYTHONPATH=src python docs/results/compile/compile-probe.py MODE [PRECISION]
"""

import sys
import time

import torch
import torch.nn.functional as F

import spectune.models.llama as llama
from spectune.drafters.pairing import load_target_at

torch.set_num_threads(2)
mode = sys.argv[1]
precision = sys.argv[2] if len(sys.argv) > 2 else "int4"


def timed(model, cache, rows: int, repeats: int) -> tuple[float, float]:
    """(seconds of the first forward, median ms of the next ``repeats``), rolled back each time."""
    x = torch.tensor([[42] * rows])
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        model.forward(x, cache)
        times.append(time.perf_counter() - start)
        cache.truncate(cache.lengths[0] - rows)
    rest = sorted(times[1:])
    return times[0], 1000 * rest[len(rest) // 2]


def report(label: str, model, cache, sizes: tuple[int, ...], repeats: int) -> None:
    for rows in sizes:
        first, median = timed(model, cache, rows, repeats)
        print(f"{label} {rows} rows: first {first:.1f} s, median {median:.2f} ms", flush=True)


def _pre(attn, norm, x, cos, sin):
    cfg = attn.cfg
    batch, chunk, _ = x.shape
    q, k, v = attn.project(norm(x))
    q = llama.apply_rotary(q.view(batch, chunk, cfg.num_heads, cfg.head_dim), cos, sin)
    k = llama.apply_rotary(k.view(batch, chunk, cfg.num_kv_heads, cfg.head_dim), cos, sin)
    return q, k, v.view(batch, chunk, cfg.num_kv_heads, cfg.head_dim)


def _post(block, x, out):
    batch, chunk = x.shape[:2]
    x = x + block.self_attn.o_proj(out.transpose(1, 2).reshape(batch, chunk, -1))
    return x + block.mlp(block.post_attention_layernorm(x))


def pieces_forward(pre, post):
    def forward(self, x, cos, sin, cache, layer, slots, mask, used, rows=None):
        q, k, v = pre(self.self_attn, self.input_layernorm, x, cos, sin)
        cache.write(layer, slots, k, v)
        keys, values = cache.view(layer, used)
        if rows is not None:
            out = rows.attend(q.transpose(1, 2), keys, values)
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
            )
        return post(self, x, out)

    return forward


if mode == "rows-attend-eager":
    llama.RowKeys.attend = torch.compiler.disable(llama.RowKeys.attend)
target = load_target_at("default", precision)
model = target.model
cache = model.new_cache(1, 1024)
model.forward(torch.tensor([[1] * 200]), cache)
eager = model.net
if mode == "whole":
    report(f"{precision} eager", model, cache, (1, 2, 4), 30)
    model.net = torch.compile(eager, dynamic=True)
    report(f"{precision} compiled", model, cache, (1, 2, 4), 30)
    model.net = eager
    report(f"{precision} eager again", model, cache, (1, 2, 4), 30)
elif mode in ("rows", "rows-attend-eager"):
    model.net = torch.compile(eager, dynamic=True)
    report(mode, model, cache, (1, 2, 3, 4, 5, 6, 9), 20)
elif mode == "pieces":
    report("eager", model, cache, (1, 2, 3, 4, 5, 9), 20)
    compiled = pieces_forward(torch.compile(_pre, dynamic=True), torch.compile(_post, dynamic=True))
    llama.Block.forward = compiled
    report("pieces compiled", model, cache, (1, 2, 3, 4, 5, 9), 20)
else:
    raise SystemExit(f"unknown mode {mode!r}")
