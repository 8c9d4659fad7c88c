#!/bin/bash
# The int4 runtime before (994d1df: output head on int8pack) and after (81beea6: output head
# on oneDNN with split activations), side by side, alternating, one quiet machine, 2 threads.
# Before: git worktree add /tmp/before 994d1df; run from the repository root:
#   OLD_SRC=/tmp/before/src OUT=/tmp/onednn-head bash docs/results/bench-onednn-head-int4/bench.sh
set -e
export MKL_CBWR=AVX2
OUT=${OUT:-/tmp/onednn-head}
mkdir -p "$OUT"
run() { # $1 label, $2 source folder, $3 round
  PYTHONPATH=$2 .venv/bin/spectune bench --target default --dtype int4 --systems plain,spectune \
    --draft suffix --draft smollm2-draft --split test --limit-per-category 5 --temperatures 0 \
    --k 2 --policies cost --max-tokens 48 --repeats 1 --threads 2 --seed 0 \
    --out "$OUT/$1-$3" > "$OUT/$1-$3.log" 2>&1
  echo "$(date +%T) done $1 $3"
}
for r in 1 2; do
  run old "$OLD_SRC" $r
  run new "$PWD/src" $r
done
for r in 1 2; do  # what `make demo` runs
  for v in old new; do
    src=$PWD/src; [ $v = old ] && src=$OLD_SRC
    PYTHONPATH=$src .venv/bin/spectune generate --chat "Explain in three sentences why the sky is blue." \
      --draft suffix --max-tokens 96 --compare > "$OUT/demo-$v-$r.log" 2>&1
    echo "$(date +%T) demo $v $r: $(grep -i speedup "$OUT/demo-$v-$r.log")"
  done
done
