# Run: PYTHONPATH=src MKL_CBWR=AVX2 python docs/results/head-kernels/acceptance.py int4 [DRAFT_FOLDER]
# (the README figures: the r1 head, /work/distill-runs/eagle3/draft)
"""Teacher-forced first-token acceptance of the shipped head (fp32 / int8 / int4 weights) on
dev-split prompts, against the int4 target's own greedy continuations."""
from pathlib import Path
import copy, json, sys
import torch
torch.set_num_threads(1)
from spectune.drafters.pairing import load_target_at
from spectune.drafters.loading import load_feature_head
from spectune.models.shipped import shipped_draft_path

t = load_target_at("default", sys.argv[1] if len(sys.argv) > 1 else "int4")
net = t.model.net
head, subset = load_feature_head(Path(sys.argv[2]) if len(sys.argv) > 2 else shipped_draft_path("smollm2-draft"), net)
heads = {"fp32": head.eval()}
for mode in ("int8", "int4"):
    h = copy.deepcopy(head); h.quantize(mode); heads[mode] = h.eval()
t.model.expose_layers(head.cfg.feature_layers)
rows = [json.loads(l) for l in open("src/spectune/assets/prompts/eval.jsonl")]
dev = [r for r in rows if r["split"] == "dev"]
hits = {k: 0 for k in heads}; n = 0
with torch.inference_mode():
    for r in dev:
        ids = t.tokenizer.encode_chat(r["messages"])
        c = t.model.new_cache(1, 1024)
        out = t.model.forward(torch.tensor([ids]), c)
        seq = list(ids); states = [out.hidden[0]]
        for _ in range(64):
            nxt = int(out.logits[0, -1].argmax())
            seq.append(nxt)
            out = t.model.forward(torch.tensor([[nxt]]), c)
            states.append(out.hidden[0])
        hs = torch.cat(states)  # [len(seq), state]
        p = len(ids)
        # head slot for position t reads token t and h[t-1], predicts token t+1
        tokens = torch.tensor([seq[1:-1]])
        target_next = torch.tensor(seq[2:])
        for name, h in heads.items():
            f = h(tokens, h.target_input(hs[:-2])[None])
            pred = subset[h.logits(f)[0].argmax(-1)]
            hits[name] += int((pred[p - 2:] == target_next[p - 2:]).sum())
        n += len(seq) - p
print({k: round(v / n, 4) for k, v in hits.items()}, "positions", n)
