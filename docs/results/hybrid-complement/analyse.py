"""Issue 15: first-token acceptance of the suffix drafter, the head, either, and a choice
between them, from ``positions.py``'s rows. Run: python analyse.py ROWS.json"""

import json
import sys

import numpy as np

rows = json.load(open(sys.argv[1]))
target = np.array([r["target"] for r in rows])
suffix_ok = np.array([r["suffix"] is not None and r["suffix"] == r["target"] for r in rows])
has_suffix = np.array([r["suffix"] is not None for r in rows])
head_ok = np.array([r["head"] for r in rows]) == target
agree = np.array([r["suffix"] is not None and r["suffix"] == r["head"] for r in rows])
head_prob = np.array([r["head_prob"] for r in rows])
suffix_prob = np.array([r["suffix_prob"] for r in rows])
length = np.array([r["match_length"] for r in rows])
print(f"{len(rows)} positions; the suffix drafter proposes at {has_suffix.mean():.1%}")
print(
    f"first token right: suffix {suffix_ok.mean():.3f}, head {head_ok.mean():.3f}, "
    f"either {(suffix_ok | head_ok).mean():.3f}, both {(suffix_ok & head_ok).mean():.3f}"
)
print(
    f"the two agree at {agree.mean():.1%} of positions, right there {suffix_ok[agree].mean():.3f}"
)


def calibrated(prob: np.ndarray, right: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Each position's rate of right guesses among positions in the same tenth of prob."""
    bins = np.minimum((prob * 10).astype(int), 9)
    rate = {
        b: right[where & (bins == b)].mean() if (where & (bins == b)).any() else 0.0
        for b in range(10)
    }
    return np.array([rate[b] for b in bins])


# In-sample calibration: an optimistic bound on what a per-step choice could reach.
pick_suffix = calibrated(suffix_prob, suffix_ok, has_suffix) >= calibrated(
    head_prob, head_ok, np.ones(len(rows), bool)
)
chosen = np.where(pick_suffix, suffix_ok, head_ok)
print(
    f"one chain, the source with the higher calibrated probability: {chosen.mean():.3f} "
    f"(suffix chosen at {pick_suffix.mean():.1%})"
)
print("\nhead probability -> rate right")
for lo in np.arange(0, 1, 0.2):
    m = (head_prob >= lo) & (head_prob < lo + 0.2 + 1e-9)
    print(f"  [{lo:.1f}, {lo + 0.2:.1f}): {m.sum():5d} positions, {head_ok[m].mean():.2f}")
print("\nsuffix match length -> suffix right / head right")
for lo, hi in ((0, 2), (2, 4), (4, 8), (8, 16), (16, 10**6)):
    m = has_suffix & (length >= lo) & (length < hi)
    print(
        f"  {f'[{lo}, {hi})' if hi < 10**6 else f'{lo}+'}: {m.sum():5d} positions, {suffix_ok[m].mean():.2f} / {head_ok[m].mean():.2f}"
    )
print("\ncategory: suffix / head / either / choice")
for c in sorted({r["category"] for r in rows}):
    m = np.array([r["category"] == c for r in rows])
    print(
        f"  {c}: {suffix_ok[m].mean():.2f} / {head_ok[m].mean():.2f} / "
        f"{(suffix_ok | head_ok)[m].mean():.2f} / {chosen[m].mean():.2f}"
    )
