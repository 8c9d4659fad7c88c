#!/usr/bin/env bash
# Distil the default feature head on one CUDA GPU, inside a fixed time:
#
#   0. optionally, more answers first (CORPUS_S > 0): CORPUS_WORKERS processes of
#      `spectune corpus --device cuda` write new shards into ANSWERS_DIR from shard
#      CORPUS_FROM on, CORPUS_SHARDS at most (each takes every CORPUS_WORKERS-th; CORPUS_ARGS
#      go to each: seeds, --batch, --items-per-shard), and are stopped after CORPUS_S
#      seconds (a shard file is written whole or not at all), while the teacher pass caches
#      the shards already there;
#   1. the teacher pass over an answer corpus (`spectune corpus --out`), cached once
#      (`spectune distill --features-only`), bf16 as every shipped stage was;
#   2. several training runs side by side on the same GPU, each `--init-from` the given
#      draft with its own learning rate and batch (RUNS), for the minutes that remain;
#   3. a summary: each run's last held-out point, best first (mean over draft positions).
#
#   scripts/distill-gpu.sh TARGET.gguf ANSWERS_DIR INIT_DRAFT OUT_DIR SECONDS
#
# SECONDS is the wall time the whole script may take; the training runs get what the
# teacher pass leaves, less RESERVE_S (loading the cache, the last evaluation, saving).
# RUNS: "LR:BATCH_TOKENS[:POSITIONS] ..." (default three; POSITIONS caps a run's training
# positions, so its cosine schedule ends after that many epochs' worth); EVAL_EVERY: steps
# between held-out checks (default 1000); PYTHON: the interpreter holding torch;
# DEVICE: cuda (default) or cpu, to try the script on a small model without a GPU.
# CORPUS_S (default 0), CORPUS_WORKERS (default 8), CORPUS_FROM, CORPUS_SHARDS, CORPUS_ARGS:
# step 0.
# Each run's draft is OUT_DIR/run-LR-BATCH[-POSITIONS]/draft, its log beside it (.log).
set -euo pipefail

if [ $# -ne 5 ]; then
    sed -n '2,26p' "$0" >&2
    exit 2
fi
target=$1 answers=$2 init=$3 out=$4 seconds=$5
python=${PYTHON:-python3}
runs=${RUNS:-"5e-4:8192:8200000 5e-4:16384 1e-3:16384:27000000"}
eval_every=${EVAL_EVERY:-1000}
reserve=${RESERVE_S:-150}
start=$(date +%s)
mkdir -p "$out"
cache=$out/cache
common=(--target "$target" --answers "$answers" --cache-dir "$cache" --kind feature
    --init-from "$init" --precision bf16 --device "${DEVICE:-cuda}")

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
corpus_s=${CORPUS_S:-0}
if [ "$corpus_s" -gt 0 ]; then
    workers=${CORPUS_WORKERS:-8}
    first=${CORPUS_FROM:?CORPUS_FROM: the first new shard}
    last=$((first + ${CORPUS_SHARDS:-100000}))
    before=$(ls "$answers"/shard-*.safetensors | wc -l)
    "$python" -m spectune distill "${common[@]}" --features-only --out "$out/teacher" \
        >"$out/teacher-0.log" 2>&1 &
    teacher=$!
    writers=()
    for ((w = 0; w < workers; w++)); do
        # shellcheck disable=SC2086  # CORPUS_ARGS is a list of arguments
        timeout "$corpus_s" "$python" -m spectune corpus --target "$target" --out "$answers" \
            --device "${DEVICE:-cuda}" --threads 1 --shards "$((first + w)):$last:$workers" \
            ${CORPUS_ARGS:-} >"$out/corpus-$w.log" 2>&1 &
        writers+=($!)
    done
    for pid in "${writers[@]}"; do
        wait "$pid" || true # stopped at the deadline: expected
    done
    wait "$teacher" || echo "distill-gpu: the first teacher pass failed (teacher-0.log)" >&2
    echo "corpus: $(($(ls "$answers"/shard-*.safetensors | wc -l) - before)) new shards" \
        "in ${corpus_s}s ($workers processes)"
fi
"$python" -m spectune distill "${common[@]}" --features-only --out "$out/teacher" \
    2>&1 | tee "$out/teacher.log"
left=$((seconds - ($(date +%s) - start) - reserve))
if [ "$left" -lt 60 ]; then
    echo "distill-gpu: the teacher pass left ${left}s of training; stopping" >&2
    exit 1
fi
minutes=$(awk "BEGIN { printf \"%.2f\", $left / 60 }")
echo "teacher pass: $(($(date +%s) - start))s; each run trains ${minutes} min"

pids=()
for spec in $runs; do
    IFS=: read -r lr batch positions <<<"$spec"
    name=run-$lr-$batch${positions:+-$positions}
    "$python" -m spectune distill "${common[@]}" --unroll 3 --lr "$lr" --batch-tokens "$batch" \
        ${positions:+--tokens "$positions"} --minutes "$minutes" --eval-every "$eval_every" \
        --threads 2 --out "$out/$name" >"$out/$name.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done

"$python" - "$out" <<'EOF'
import json
import sys
from pathlib import Path

rows = []
for meta in Path(sys.argv[1]).glob("run-*/draft/spectune_draft.json"):
    curve = json.loads(meta.read_text())["training"]["curve"]
    first, last = curve[0], curve[-1]
    mean = sum(last["heldout_top1_by_position"]) / len(last["heldout_top1_by_position"])
    rows.append((mean, meta.parent.parent.name, first, last))
for mean, name, first, last in sorted(rows, reverse=True):
    before = " / ".join(f"{a:.3f}" for a in first["heldout_top1_by_position"])
    after = " / ".join(f"{a:.3f}" for a in last["heldout_top1_by_position"])
    print(
        f"{name}: held-out {before} -> {after} (mean {mean:.3f}); "
        f"{last['step']} steps, {last['tokens']:,} positions, {last['seconds']:.0f}s"
    )
EOF
exit $status
