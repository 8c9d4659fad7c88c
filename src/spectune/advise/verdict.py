"""The verdict: speculate with the winner, or do not speculate here.

A configuration wins only when its measured speedup beats plain decoding by more than its
measured noise (``VerifiedRun.noise``): speedup - noise > 1. Among those, the one with the
highest lower bound (speedup - noise) wins: a noisy run that measured faster by luck does not
beat a steady one. When none qualifies, the verdict says so with the figures behind it: the
best measured speedup and its noise, and the acceptance that the best configuration's K
would need just to break even on this machine, beside the acceptance it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spectune.advise.measure import VerifiedRun
from spectune.advise.predict import ConfigPrediction

__all__ = ["DO_NOT_SPECULATE", "NEXT_STEP", "NO_VERDICT", "Verdict", "decide", "withheld"]

DO_NOT_SPECULATE = "do not speculate here"
NEXT_STEP = "next step: serve without speculation: "  # then the command
NO_VERDICT = "no verdict: the machine was busy while advise measured"


@dataclass(frozen=True)
class Verdict:
    speculate: bool
    winner: str | None  # the winning configuration's label
    summary: str  # "speculate with ..." or DO_NOT_SPECULATE
    reasons: tuple[str, ...]
    needed_acceptance: float | None = None  # break-even alpha at the best configuration's K


def decide(predictions: Sequence[ConfigPrediction], verified: Sequence[VerifiedRun]) -> Verdict:
    """``verified[i]`` is the run of the configuration labelled ``verified[i].label``."""
    by_label = {p.label: p for p in predictions}
    winners = sorted(
        (v for v in verified if v.speedup - v.noise > 1.0),
        key=lambda v: v.speedup - v.noise,
        reverse=True,
    )
    if winners:
        best = winners[0]
        prediction = by_label[best.label]
        error = (best.speedup - prediction.predicted_speedup) / prediction.predicted_speedup
        return Verdict(
            True,
            best.label,
            f"speculate with {best.label}",
            (
                f"measured {best.speedup:.2f}x +-{best.noise:.2f} against plain decoding, "
                f"beyond the noise",
                f"predicted {prediction.predicted_speedup:.2f}x (error {error:+.0%})",
                f"acceptance {prediction.alpha:.0%} against a break-even of "
                f"{_shown(prediction.break_even.get(prediction.k))} at K={prediction.k}",
            ),
        )
    reasons: list[str] = []
    needed = None
    if verified:
        best = max(verified, key=lambda v: v.speedup)
        reasons.append(
            f"best measured {best.label}: {best.speedup:.2f}x +-{best.noise:.2f}, "
            "not above plain decoding by more than the noise"
        )
        prediction = by_label[best.label]
    elif predictions:
        prediction = max(predictions, key=lambda p: p.predicted_speedup)
    else:
        return Verdict(False, None, DO_NOT_SPECULATE, ("no compatible draft to measure",))
    needed = prediction.break_even.get(prediction.k)
    reasons.append(
        f"{prediction.label} has acceptance {prediction.alpha:.0%} at draft cost "
        f"c={prediction.draft_cost:.3f} and v(K)={prediction.verify_cost:.2f}: it needs "
        f"{_shown(needed)} to break even"
    )
    return Verdict(False, None, DO_NOT_SPECULATE, tuple(reasons), needed)


def withheld(verdict: Verdict, load: str) -> Verdict:
    """No verdict from figures that other processes' load disturbed (``load``: the line
    that says how busy the machine was): the verdict that they would have given stays
    among the reasons, marked as such, with what to do instead."""
    return Verdict(
        False,
        None,
        NO_VERDICT,
        (
            load,
            "rerun advise on a quiet machine (cat /proc/loadavg first); with the figures of "
            f"this run it would say: {verdict.summary}",
            *verdict.reasons,
        ),
        verdict.needed_acceptance,
    )


def _shown(alpha: float | None) -> str:
    return "an acceptance above 100% (unreachable)" if alpha is None else f"{alpha:.0%}"


@dataclass(frozen=True)
class CheckRow:
    """One of the health rules (``spectune.monitor.health``) as a checklist row."""

    rule: str
    band: str
    value: float | None
    met: bool | None  # None: not measurable here
    percent: bool

    def shown(self) -> str:
        if self.value is None:
            return "n/a"
        return f"{self.value:.0%}" if self.percent else f"{self.value:.2f}x"


def checklist(prediction: ConfigPrediction, run: VerifiedRun) -> tuple[list[CheckRow], list[str]]:
    """The health rules for ``run``, and notes where this machine's optimum departs from
    the rule of thumb."""

    def row(
        rule: str, band: str, value: float | None, low: float | None, high: float | None, pct: bool
    ) -> CheckRow:
        met = None
        if value is not None:
            met = (low is None or value > low) and (high is None or value < high)
        return CheckRow(rule, band, value, met, pct)

    counts = run.counts
    rows = [
        row("acceptance baseline (test set)", "> 65%", prediction.alpha, 0.65, None, True),
        row("acceptance live", "60% - 85%", counts.acceptance_rate, 0.60, 0.85, True),
        row("draft latency share", "< 40%", counts.draft_share, None, 0.40, True),
        row("fallback steps", "< 5%", counts.fallback_frequency, None, 0.05, True),
        row("end-to-end speedup", "1.5x - 2.5x", run.speedup, 1.5, 2.5, False),
    ]
    notes = []
    live = counts.acceptance_rate
    pays = run.speedup - run.noise > 1.0  # beyond the noise, as the verdict asks
    if pays and live is not None and not 0.60 <= live <= 0.85:
        notes.append(
            f"{run.label} pays ({run.speedup:.2f}x) at a live acceptance of {live:.0%}, outside "
            f"the 60-85% rule: on this machine v({prediction.k}) = {prediction.verify_cost:.2f} "
            f"and c = {prediction.draft_cost:.3f} put the optimum there"
        )
    if pays and prediction.alpha <= 0.65:
        notes.append(
            f"{run.label} pays with a baseline acceptance of {prediction.alpha:.0%}, under the "
            "65% rule of thumb: its break-even acceptance here is "
            f"{_shown(prediction.break_even.get(prediction.k))}"
        )
    if pays and run.speedup < 1.5:
        notes.append(
            f"the measured optimum ({run.speedup:.2f}x) is under the 1.5-2.5x band: a small "
            "target on a CPU leaves little to win"
        )
    return rows, notes
