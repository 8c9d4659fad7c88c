#!/usr/bin/env bash
# Reruns the example outputs quoted in docs/ (usage, drafts, adaptive, trees-batching,
# suffix, advise), each into OUT/NAME.txt with the command on its first line.
# Usage: bash docs/results/examples/run.sh [OUT]   (about 15 minutes on two cores)
#        ONLY="select tune" bash docs/results/examples/run.sh   (just those examples)
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-docs/results/examples}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export COLUMNS=100
[ -n "${MKL_CBWR:-}" ] || ! grep -qm1 AuthenticAMD /proc/cpuinfo || export MKL_CBWR=AVX2

run() {
  local name=$1
  shift
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || return 0
  local line="\$ spectune" arg
  for arg in "$@"; do
    case $arg in
      *[![:alnum:]/._:,=+-]*) line+=" \"$arg\"" ;;
      *) line+=" $arg" ;;
    esac
  done
  echo "$line" | sed "s#$work#/tmp#g" >"$out/$name.txt"
  .venv/bin/spectune "$@" 2>&1 | sed "s#$work#/tmp#g" >>"$out/$name.txt"
}

run generate-compare generate --chat "Why is the sky blue?" --draft suffix \
  --max-tokens 48 --threads 2 --compare
run generate-json generate --chat "Name three primary colours." --draft suffix \
  --max-tokens 24 --threads 2 --json
run generate-tree generate --chat "List three uses of copper." --draft smollm2-draft \
  --tree-width 2 --tree-nodes 4 --max-tokens 48 --threads 2 --compare
run suffix-hybrid generate --chat "Solve 12 * 7 step by step." --draft hybrid \
  --max-tokens 64 --threads 2 --compare
run trace generate --chat "Write a haiku about caches." --draft suffix \
  --max-tokens 64 --threads 2 --trace "$work/run.jsonl" --compare
run report report "$work/run.jsonl" --out "$work/run_report"
run select select smollm2-draft suffix ngram --limit-per-category 1 \
  --continuation-tokens 32 --confirm-prompts 3 --confirm-tokens 32 --out "$work/select"
run tune tune --target default --draft suffix --limit-per-category 1 --max-tokens 48 \
  --confirm-prompts 3 --out "$work/tuned.toml"
echo '[1, 2, 3, 4, 2, 3, 5]' >"$work/answers.jsonl"
run suffix-index suffix-index "$work/answers.jsonl" -o "$work/my.npz"
