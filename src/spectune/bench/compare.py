"""Two runs of one benchmark side by side: how far each speedup moved, against its noise.

``spectune bench --baseline OLD/results.json`` (and ``make results``, against the committed
run) pairs every cell the two runs share (system, runtime, temperature; all categories) and
reports the previous and the new tokens/s and speedup over plain decoding, their difference,
and that difference's standard error from the prompts' timing noise.

The standard error is a paired jackknife over the prompts both runs timed: leaving one
prompt out of both runs, the difference of the two pooled speedups (tokens over seconds,
the system's against plain decoding's) is recomputed; the spread of those n values gives
the difference's standard error. A cell whose difference exceeds two standard errors moved
beyond the per-prompt noise: under that noise alone it would do so 5-7% of the time (about
7% over 14 prompts, a t distribution with 13 degrees of freedom), so a few such cells among
dozens are expected; many, or all in one direction, mean the machine or the code changed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spectune.bench.readme import Cell, all_cells, runtime_name
from spectune.bench.summary import PLAIN  # every speedup is over it, llama.cpp's own too
from spectune.errors import InvalidParameterError

__all__ = [
    "BEYOND",
    "CellChange",
    "compare_runs",
    "comparison_markdown",
    "load_baseline",
    "summary_line",
    "write_comparison",
]

BEYOND = 2.0  # standard errors: a difference past this is reported as beyond noise

Timings = dict[str, tuple[int, float]]  # prompt id -> (tokens, seconds) over repeats


@dataclasses.dataclass(frozen=True)
class CellChange:
    """One cell of both runs: previous and new tokens/s and speedup, the difference of the
    speedups and its standard error (None where either run lacks per-prompt timings)."""

    system: str
    dtype: str
    temperature: float
    old_tps: float
    new_tps: float
    old_speedup: float | None
    new_speedup: float | None
    difference: float | None
    stderr: float | None

    @property
    def beyond_noise(self) -> bool:
        return (
            self.difference is not None
            and self.stderr is not None
            and abs(self.difference) > BEYOND * self.stderr
        )


def load_baseline(path: Path) -> dict[str, Any]:
    """A previous run's ``results.json``; ``InvalidParameterError`` for one that cannot be
    read or is not a benchmark's results."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidParameterError(f"--baseline {path}: cannot read it: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise InvalidParameterError(
            f"--baseline {path} is not a benchmark's results.json (no 'rows' list)"
        )
    problem = _results_problem(data)
    if problem is not None:
        raise InvalidParameterError(
            f"--baseline {path} is not a benchmark's results.json ({problem})"
        )
    return data


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string(value: Any) -> bool:
    return isinstance(value, str)


Fields = tuple[tuple[str, Callable[[Any], bool], str], ...]  # (field, check, what it must be)

# What the comparison reads of a run's rows over all categories and of its measurements.
_ROW_FIELDS: Fields = (
    ("system", _string, "a string"),
    ("dtype", _string, "a string"),
    ("temperature", _number, "a number"),
    ("tokens_per_second", _number, "a number"),
    ("speedup_vs_plain", lambda v: v is None or _number(v), "a number or null"),
)
_MEASUREMENT_FIELDS: Fields = (
    ("system", _string, "a string"),
    ("dtype", _string, "a string"),
    ("temperature", _number, "a number"),
    ("prompt_id", _string, "a string"),
    ("tokens", lambda v: isinstance(v, list), "a list"),
    ("seconds", _number, "a number"),
)


def _results_problem(data: Mapping[str, Any]) -> str | None:
    """What of ``data`` the comparison could not read (None: nothing), checked before the
    run, so that a wrong file fails in a second instead of after the whole benchmark."""
    rows, measurements = data["rows"], data.get("measurements", [])
    if not all(isinstance(row, dict) for row in rows):
        return "a row is not an object"
    cells = [(i, row) for i, row in enumerate(rows) if row.get("category") == "all"]
    if not cells:
        return "no row over all categories"
    if not isinstance(measurements, list):
        return "'measurements' is not a list"
    if not isinstance(data.get("environment", {}), dict):
        return "'environment' is not an object"
    return _fields_problem("rows", cells, _ROW_FIELDS) or _fields_problem(
        "measurements", enumerate(measurements), _MEASUREMENT_FIELDS
    )


def _fields_problem(name: str, items: Iterable[tuple[int, Any]], fields: Fields) -> str | None:
    for i, item in items:
        if not isinstance(item, dict):
            return f"{name}[{i}] is not an object"
        for field, check, kind in fields:
            if not check(item.get(field)):
                return f"{name}[{i}].{field} is not {kind}"
    return None


def _timings(data: Mapping[str, Any]) -> dict[Cell, Timings]:
    sums: dict[Cell, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for m in data.get("measurements", []):
        cell = sums[(m["system"], m["dtype"], float(m["temperature"]))][m["prompt_id"]]
        cell[0] += len(m["tokens"])
        cell[1] += m["seconds"]
    return {
        cell: {p: (int(t), s) for p, (t, s) in prompts.items()} for cell, prompts in sums.items()
    }


def _pooled_speedup(system: Timings, plain: Timings, prompts: Sequence[str]) -> float:
    def rate(t: Timings) -> float:
        seconds = sum(t[p][1] for p in prompts)
        return sum(t[p][0] for p in prompts) / seconds if seconds > 0 else 0.0

    base = rate(plain)
    return rate(system) / base if base > 0 else 0.0


def _stderr(
    old: Mapping[Cell, Timings], new: Mapping[Cell, Timings], system: str, dtype: str, t: float
) -> float | None:
    """The paired jackknife standard error of (new speedup - old speedup)."""
    keys = [(system, dtype, t), (PLAIN, dtype, t)]
    if not all(k in old and k in new for k in keys):
        return None
    prompts = sorted(set.intersection(*(set(runs[k]) for runs in (old, new) for k in keys)))
    if len(prompts) < 3:
        return None
    left_out = [
        _pooled_speedup(new[keys[0]], new[keys[1]], rest)
        - _pooled_speedup(old[keys[0]], old[keys[1]], rest)
        for rest in ([q for q in prompts if q != p] for p in prompts)
    ]
    n = len(left_out)
    mean = statistics.fmean(left_out)
    return math.sqrt((n - 1) / n * sum((d - mean) ** 2 for d in left_out))


def compare_runs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[CellChange]:
    """Every cell both runs hold, in the new run's order; plain decoding's with its tokens/s
    only (its speedup is 1 by definition)."""
    old_rows, new_rows = all_cells(old), all_cells(new)
    old_times, new_times = _timings(old), _timings(new)
    changes = []
    for cell, row in new_rows.items():
        before = old_rows.get(cell)
        if before is None:
            continue
        system, dtype, t = cell
        a, b = before["speedup_vs_plain"], row["speedup_vs_plain"]
        difference = None if system == PLAIN or a is None or b is None else b - a
        changes.append(
            CellChange(
                system=system,
                dtype=dtype,
                temperature=t,
                old_tps=before["tokens_per_second"],
                new_tps=row["tokens_per_second"],
                old_speedup=a,
                new_speedup=b,
                difference=difference,
                stderr=None if difference is None else _stderr(old_times, new_times, *cell),
            )
        )
    return changes


def _speedup(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def summary_line(changes: Sequence[CellChange]) -> str:
    """One sentence: how many speedups moved beyond noise, and the typical move."""
    judged = [c for c in changes if c.difference is not None and c.stderr is not None]
    if not judged:
        return "No speedup of the two runs could be compared (no shared per-prompt timings)."
    moves = sorted(abs(c.difference or 0.0) for c in judged)
    beyond = [c for c in judged if c.beyond_noise]
    mean = statistics.fmean(c.difference or 0.0 for c in judged)
    return (
        f"{len(judged) - len(beyond)} of {len(judged)} speedups moved less than {BEYOND:g} "
        f"standard errors; the median move {statistics.median(moves):.2f}x, the largest "
        f"{moves[-1]:.2f}x, the mean difference {mean:+z.2f}x."
    )


def comparison_markdown(
    changes: Sequence[CellChange], old: Mapping[str, Any], new: Mapping[str, Any]
) -> str:
    """The comparison as a Markdown page: both runs' machines and commands, one line per
    cell, and the summary line."""

    def machine(data: Mapping[str, Any]) -> str:
        return str(data.get("environment", {}).get("machine", "unknown machine"))

    lines = [
        "# This run against the previous one",
        "",
        f"Previous: {machine(old)}; `{old.get('command', '')}`",
        "",
        f"This run: {machine(new)}; `{new.get('command', '')}`",
        "",
        "Tokens/s and the speedup over plain decoding on the same runtime; `difference`: this "
        "run's speedup minus the previous one's, with its standard error (a paired jackknife "
        f"over the prompts); `beyond noise`: more than {BEYOND:g} standard errors.",
        "",
        "| system | runtime | T | tokens/s before | tokens/s now | speedup before | "
        "speedup now | difference | beyond noise |",
        "|---|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for c in changes:
        if c.difference is None:
            moved = ""
        elif c.stderr is None:
            moved = f"{c.difference:+z.2f}x"
        else:
            moved = f"{c.difference:+z.2f}x ± {c.stderr:.2f}"
        lines.append(
            f"| {c.system.removeprefix('spectune ')} | {runtime_name(c.dtype)} | {c.temperature:g} "
            f"| {c.old_tps:.1f} | {c.new_tps:.1f} | {_speedup(c.old_speedup)} "
            f"| {_speedup(c.new_speedup)} | {moved} | {'yes' if c.beyond_noise else ''} |"
        )
    lines += ["", summary_line(changes), ""]
    return "\n".join(lines)


def write_comparison(old: Mapping[str, Any], new: Mapping[str, Any], out: Path) -> tuple[Path, str]:
    """Write ``comparison.md`` into ``out``; its path and the summary line."""
    changes = compare_runs(old, new)
    page = out / "comparison.md"
    page.write_text(comparison_markdown(changes, old, new), encoding="utf-8")
    return page, summary_line(changes)
