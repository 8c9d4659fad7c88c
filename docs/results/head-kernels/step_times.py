# Run: PYTHONPATH=src python docs/results/head-kernels/step_times.py THREADS [DRAFT_FOLDER or '' [TARGET_PRECISION]]
# (MKL_CBWR=AVX2 on an AMD CPU; the README figures: 1 thread, the r1 head, a busy machine;
# the head_kernels docstring: 2 threads, the r4 head, fp32 target, 2026-12-04 Intel Xeon)
"""Head step cost and top-1 agreement: fp32 head vs int8 / int4 head, beside a target step
(int4 unless TARGET_PRECISION says otherwise). The agreement is over a chat prompt followed by
60 random tokens, a harsher input than text."""
from pathlib import Path
import copy, time, sys
import torch
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
from spectune.drafters.pairing import load_target_at
from spectune.drafters.loading import load_feature_head
from spectune.models.shipped import shipped_draft_path

precision = sys.argv[3] if len(sys.argv) > 3 else "int4"
t = load_target_at("default", precision)
net = t.model.net
head, subset = load_feature_head(Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else shipped_draft_path("smollm2-draft"), net)
head = head.eval()
heads = {"fp32": head}
for mode in ("int8", "int4"):
    h = copy.deepcopy(head); h.quantize(mode); heads[mode] = h
g = torch.Generator().manual_seed(0)
# real features: run the target over a chat, exposing layers
t.model.expose_layers(head.cfg.feature_layers)
ids = t.tokenizer.encode_chat([{"role": "user", "content": "Explain in three sentences why the sky is blue, and then list three colours of sunsets."}])
ids = ids + [int(x) for x in torch.randint(100, 5000, (60,), generator=g)]
with torch.inference_mode():
    cache = t.model.new_cache(1, 512)
    out = t.model.forward(torch.tensor([ids]), cache)
    states = out.hidden[0]  # [n, state]
    tokens = torch.tensor([ids[1:]])
    prev = head.target_input(states[:-1])[None]
    res = {}
    for name, h in heads.items():
        f = h(tokens, h.target_input(states[:-1])[None])
        res[name] = h.logits(f)[0]
    for name in ("int8", "int4"):
        agree = (res[name].argmax(-1) == res["fp32"].argmax(-1)).float().mean().item()
        err = (res[name] - res["fp32"]).abs().max().item()
        print(f"{name}: top-1 agreement with fp32 head {agree:.3f} over {len(ids)-1} positions, max |dlogit| {err:.3f}")
    # one-token step timing with a cache
    for name, h in heads.items():
        c = h.new_cache(256)
        h(tokens[:, :40], prev[:, :40], c)
        x = tokens[:, 40:41]; p = prev[:, 40:41]
        times = []
        for i in range(200):
            c.truncate(40, 0) if hasattr(c, "truncate") else None
            s = time.perf_counter(); f = h(x, p, c); h.logits(f); times.append(time.perf_counter() - s)
        times.sort()
        print(f"{name} head step: median {1000*times[100]:.2f} ms  p10 {1000*times[20]:.2f}")
    # the target's one-token step
    c = t.model.new_cache(1, 512)
    t.model.forward(torch.tensor([ids[:40]]), c)
    times = []
    for i in range(50):
        c.truncate(40, 0) if hasattr(c, "truncate") else None
        s = time.perf_counter(); t.model.forward(torch.tensor([[ids[40]]]), c); times.append(time.perf_counter() - s)
    times.sort()
    print(f"{precision} target step: median {1000*times[25]:.2f} ms")
