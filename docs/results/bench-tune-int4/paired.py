"""Each tuned policy against its fixed-K twin, call by call, from this bench's results.json:
how many calls did the same work (same tokens, same target calls) and the time ratios.

Run from the repository root: python docs/results/bench-tune-int4/paired.py [RESULTS.json
[TWIN_K_NGRAM]] (default: this folder's results.json, where n-gram's tuned policy started at
K = 2; for bench-tune-int4-r4, whose retuned n-gram policy starts at K = 1, pass 1). Each
repetition of a call is paired with the same repetition of its twin.
"""

import json
import statistics
import sys
from pathlib import Path

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("results.json")
ngram_twin = sys.argv[2] if len(sys.argv) > 2 else "2"
results = json.loads(path.read_text())
calls = {
    (m["system"], m["temperature"], m["prompt_id"], m.get("repeat", 0)): m
    for m in results["measurements"]
}
PAIRS = (
    ("spectune smollm2-draft tuned-smollm2-draft-int4", "spectune smollm2-draft K=1"),
    ("spectune ngram tuned-ngram-int4", f"spectune ngram K={ngram_twin}"),
)
for temperature in (0.0, 0.7):
    for tuned, twin in PAIRS:
        ratios, same, slowest = [], 0, None
        for (system, t, prompt, repeat), call in calls.items():
            if system != tuned or t != temperature:
                continue
            other = calls[(twin, t, prompt, repeat)]
            ratio = call["seconds"] / other["seconds"]
            ratios.append(ratio)
            same += call["tokens"] == other["tokens"] and call["target_calls"] == other["target_calls"]
            if slowest is None or ratio > slowest[0]:
                slowest = (ratio, prompt, call["seconds"], other["seconds"])
        ratios.sort()
        n = len(ratios)
        print(
            f"T={temperature} {tuned} / {twin}: {same}/{n} calls the same work; time ratio "
            f"median {statistics.median(ratios):.3f}, 10th-90th percentile "
            f"{ratios[n // 10]:.2f}-{ratios[9 * n // 10]:.2f}; slowest {slowest[0]:.2f} "
            f"({slowest[1]}: {slowest[2]:.2f} s against {slowest[3]:.2f} s)"
        )
