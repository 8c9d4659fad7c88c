"""llama.cpp's tuning grid, and its speculation flags chosen by measuring them.

llama.cpp applies none of spectune's rules itself, and its speed with a draft depends on
kernels spectune's cost model does not see, so the flags are chosen by measurement:

1. ``flag_grid``: speculation off, llama.cpp's own defaults for the draft model (what a user
   gets with ``--spec-draft-model`` alone), a grid of ``--spec-draft-n-max`` x
   ``--spec-draft-p-min``, and ``ngram-simple`` prompt lookup at a few n-gram sizes.
2. Every configuration gets its own ``llama-server`` (``server.ServerPool``), all loaded before
   anything is timed; only one serves at a time, so the idle ones cost nothing.
3. ``screen``: each configuration replays the screening prompts (greedy, a fixed number of
   tokens), prompt by prompt in rotating order, so that drift of the machine's speed falls on
   all configurations alike.
4. ``confirm``: off, llama.cpp's defaults and the best screened configurations replay the
   held-apart prompts for several interleaved rounds. The winner is the fastest there if it
   beats off by more than the noise (its speedup less the spread above 1), else off;
   speed is completion tokens over the client's wall-clock time of each request (prompt
   included, as a user sees it), and each configuration's speedup is the ratio of its time
   to off's on the same prompt in the same round (geometric mean, with the spread).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectune.engines.llamacpp.server import Candidate, Measured, ServerPool, replay_one
from spectune.errors import InvalidParameterError
from spectune.prompts import EvalPrompt

__all__ = [
    "DEFAULTS_NAME",
    "OFF_NAME",
    "LlamaTuneResult",
    "Row",
    "beats_off",
    "flag_grid",
    "tune_llamacpp",
    "verdict_of",
]

DEFAULTS_NAME = "draft defaults"
OFF_NAME = "off"


def _number(value: float) -> str:
    return f"{value:g}"


def flag_grid(
    draft: Path | None,
    n_max: Sequence[int],
    p_min: Sequence[float],
    *,
    ngram: bool = True,
) -> list[Candidate]:
    """Off first, then llama.cpp's defaults for ``draft``, the n-max x p-min grid (without
    the point the defaults already are: n-max 3, p-min 0), then ngram-simple lookups."""
    grid = [Candidate(OFF_NAME, ())]
    if draft is not None:
        base = ("--spec-type", "draft-simple", "--spec-draft-model", str(draft))
        grid.append(Candidate(DEFAULTS_NAME, base))
        for n in n_max:
            for p in p_min:
                if (n, p) == (3, 0.0):
                    continue
                grid.append(
                    Candidate(
                        f"draft n-max {n} p-min {_number(p)}",
                        (
                            *base,
                            "--spec-draft-n-max",
                            str(n),
                            "--spec-draft-p-min",
                            _number(p),
                        ),
                    )
                )
    if ngram:
        grid.append(Candidate("ngram-simple defaults", ("--spec-type", "ngram-simple")))
        for size_n, size_m in ((4, 8), (3, 4)):
            grid.append(
                Candidate(
                    f"ngram-simple n {size_n} m {size_m}",
                    (
                        "--spec-type",
                        "ngram-simple",
                        "--spec-ngram-simple-size-n",
                        str(size_n),
                        "--spec-ngram-simple-size-m",
                        str(size_m),
                    ),
                )
            )
    return grid


@dataclass
class Row:
    """One candidate's measurements in one phase, keyed by (round, prompt id)."""

    candidate: Candidate
    runs: dict[tuple[int, str], Measured] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.runs.values())

    @property
    def seconds(self) -> float:
        return sum(m.seconds for m in self.runs.values())

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        drafted = sum(m.drafted for m in self.runs.values())
        return sum(m.accepted for m in self.runs.values()) / drafted if drafted else None

    def speedups(self, off: Row) -> list[float]:
        """Off's time over this one's, per request both ran (same prompt, same round)."""
        return [
            off.runs[key].seconds / run.seconds
            for key, run in self.runs.items()
            if key in off.runs and run.seconds > 0
        ]

    def summary(self, off: Row) -> dict[str, Any]:
        ratios = self.speedups(off)
        logs = [math.log(r) for r in ratios]
        return {
            "name": self.candidate.name,
            "args": list(self.candidate.args),
            "requests": len(self.runs),
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "acceptance": None if self.acceptance is None else round(self.acceptance, 4),
            "speedup": round(math.exp(statistics.fmean(logs)), 4) if logs else None,
            "speedup_spread": round(math.exp(statistics.fmean(logs)) * statistics.stdev(logs), 4)
            if len(logs) > 1
            else None,
            "greedy_equal": sum(
                run.text == off.runs[key].text for key, run in self.runs.items() if key in off.runs
            ),
        }


def _measure(
    pool: ServerPool,
    candidates: Sequence[Candidate],
    prompts: Sequence[EvalPrompt],
    rounds: int,
    max_tokens: int,
    progress: Callable[[], None],
) -> dict[str, Row]:
    """Each prompt on every candidate, the candidates' order rotated per prompt and round."""
    rows = {c.name: Row(c) for c in candidates}
    turn = 0
    for round_ in range(rounds):
        for prompt in prompts:
            order = list(candidates[turn % len(candidates) :]) + list(
                candidates[: turn % len(candidates)]
            )
            turn += 1
            for candidate in order:
                rows[candidate.name].runs[(round_, prompt.id)] = replay_one(
                    pool.urls[candidate.name], prompt, max_tokens
                )
                progress()
    return rows


@dataclass
class LlamaTuneResult:
    """Both phases' rows (summaries against off) and the choice, as ``flags.json`` holds."""

    screen: list[dict[str, Any]]
    confirm: list[dict[str, Any]]
    winner: dict[str, Any]  # the flags to serve with: the fastest, or off within the noise
    fastest: dict[str, Any]
    defaults: dict[str, Any] | None
    verdict: str
    settings: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": "llamacpp",
            "verdict": self.verdict,
            "winner": self.winner,
            "fastest": self.fastest,
            "llamacpp_defaults": self.defaults,
            "confirm": self.confirm,
            "screen": self.screen,
            "settings": self.settings,
        }


def beats_off(row: dict[str, Any]) -> bool:
    """Faster than off by more than the noise: the speedup less its spread is above 1."""
    spread = row["speedup_spread"] or 0.0
    return row["name"] != OFF_NAME and row["speedup"] is not None and row["speedup"] - spread > 1


def verdict_of(fastest: dict[str, Any], defaults: dict[str, Any] | None) -> tuple[str, bool]:
    """One line, and whether to speculate: the fastest configuration when it beats off by
    more than the noise, else off (so that tuning never costs speed)."""
    against = "" if defaults is None else f"; llama.cpp's defaults: {defaults['speedup']:.2f}x off"
    if fastest["name"] == OFF_NAME:
        return f"speculation off is fastest here: serve without --spec-type{against}", False
    gain = f"{fastest['speedup']:.2f}x off"
    if fastest["speedup_spread"] is not None:
        gain += f" ±{fastest['speedup_spread']:.2f}"
    if not beats_off(fastest):
        return (
            f"nothing beats speculation off by more than the noise (fastest: {fastest['name']}, "
            f"{gain}): serve without --spec-type{against}",
            False,
        )
    line = f"{fastest['name']} is fastest: {gain}"
    if defaults is not None and defaults["name"] != fastest["name"]:
        line += against
    return line, True


def tune_llamacpp(
    binary: Path,
    model: Path,
    candidates: Sequence[Candidate],
    screen_prompts: Sequence[EvalPrompt],
    confirm_prompts: Sequence[EvalPrompt],
    *,
    max_tokens: int,
    rounds: int,
    finalists: int,
    threads: int,
    context: int = 2048,
    on_start: Callable[[Candidate], None] | None = None,
    progress: Callable[[], None] = lambda: None,
) -> LlamaTuneResult:
    """Screen every candidate, confirm the best ``finalists`` with off and the defaults."""
    if not candidates or candidates[0].name != OFF_NAME:
        raise InvalidParameterError("the first candidate must be speculation off")
    if not screen_prompts or not confirm_prompts:
        raise InvalidParameterError("tuning needs screening and confirmation prompts")
    with ServerPool(
        binary, model, candidates, threads=threads, context=context, on_start=on_start
    ) as pool:
        screened = _measure(pool, candidates, screen_prompts, 1, max_tokens, progress)
        off = screened[OFF_NAME]
        screen = sorted(
            (row.summary(off) for row in screened.values()),
            key=lambda s: -s["tokens_per_second"],
        )
        chosen = [OFF_NAME]
        if DEFAULTS_NAME in screened:
            chosen.append(DEFAULTS_NAME)
        for entry in screen:
            if len(chosen) >= finalists + 2:
                break
            if entry["name"] not in chosen:
                chosen.append(entry["name"])
        final = [c for c in candidates if c.name in chosen]
        confirmed = _measure(pool, final, confirm_prompts, rounds, max_tokens, progress)
    off = confirmed[OFF_NAME]
    confirm = sorted(
        (row.summary(off) for row in confirmed.values()), key=lambda s: -s["tokens_per_second"]
    )
    fastest = confirm[0]
    defaults = next((s for s in confirm if s["name"] == DEFAULTS_NAME), None)
    verdict, speculate = verdict_of(fastest, defaults)
    return LlamaTuneResult(
        screen=screen,
        confirm=confirm,
        winner=fastest if speculate else next(s for s in confirm if s["name"] == OFF_NAME),
        fastest=fastest,
        defaults=defaults,
        verdict=verdict,
        settings={
            "binary": str(binary),
            "model": str(model),
            "threads": threads,
            "max_tokens": max_tokens,
            "rounds": rounds,
            "screen_prompts": [p.id for p in screen_prompts],
            "confirm_prompts": [p.id for p in confirm_prompts],
        },
    )
