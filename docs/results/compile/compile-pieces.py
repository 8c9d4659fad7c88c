"""Issue 13 lead: compile only the pieces around attention (norm, q/k/v, rotary; o_proj, MLP),
attention eager, so one graph serves every row count; int4, against eager.
Run: PYTHONPATH=src python docs/results/compile/compile-pieces.py
"""

import time, torch, sys

torch.set_num_threads(2)
import spectune.models.llama as L
from spectune.models.llama import apply_rotary


def _pre(attn, norm, x, cos, sin):
    cfg = attn.cfg
    batch, chunk, _ = x.shape
    q, k, v = attn.project(norm(x))
    q = apply_rotary(q.view(batch, chunk, cfg.num_heads, cfg.head_dim), cos, sin)
    k = apply_rotary(k.view(batch, chunk, cfg.num_kv_heads, cfg.head_dim), cos, sin)
    v = v.view(batch, chunk, cfg.num_kv_heads, cfg.head_dim)
    return q, k, v


def _post(block, x, out):
    batch, chunk = x.shape[:2]
    x = x + block.self_attn.o_proj(out.transpose(1, 2).reshape(batch, chunk, -1))
    return x + block.mlp(block.post_attention_layernorm(x))


pre = torch.compile(_pre, dynamic=True)
post = torch.compile(_post, dynamic=True)


def block_forward(self, x, cos, sin, cache, layer, slots, mask, used, rows=None):
    attn = self.self_attn
    q, k, v = pre(attn, self.input_layernorm, x, cos, sin)
    cache.write(layer, slots, k, v)
    keys, values = cache.view(layer, used)
    if rows is not None:
        out = rows.attend(q.transpose(1, 2), keys, values)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
        )
    return post(self, x, out)


from spectune.drafters.pairing import load_target_at

t = load_target_at("default", "int4")
m = t.model
cache = m.new_cache(1, 1024)
m.forward(torch.tensor([[1] * 200]), cache)


def run(label):
    for rows in (1, 2, 3, 4, 5, 9):
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
            label,
            rows,
            "first s",
            round(first, 1),
            "median ms",
            round(1000 * ts[10], 2),
            flush=True,
        )


run("eager")
L.Block.forward = block_forward
run("C")
