"""results.json (every raw timing and every shown field) and results.md (README-ready).

Each Markdown cell is produced by a ``Column`` from named row fields, and the same rows
go to the JSON, so the JSON holds everything the tables show (a test checks it cell by
cell).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.bench.runner import Measurement
from spectune.bench.summary import ALL, Mismatch, Row
from spectune.control.costs import CostCurve

__all__ = ["COLUMNS", "Column", "cell", "json_text", "markdown", "results_json", "write_results"]

RowData = Mapping[str, Any]


def _num(value: Any, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def _pct(value: Any) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _count(equal: int, compared: int) -> str:
    return "—" if compared == 0 else f"{equal}/{compared}"


@dataclass(frozen=True)
class Column:
    header: str
    fields: tuple[str, ...]  # the row fields this cell is made of (all present in the JSON)
    render: Callable[[RowData], str]


COLUMNS: tuple[Column, ...] = (
    Column("system", ("system",), lambda r: str(r["system"])),
    Column("tok/s", ("tokens_per_second",), lambda r: _num(r["tokens_per_second"])),
    Column(
        "min–max",
        ("tps_min", "tps_max"),
        lambda r: f"{_num(r['tps_min'])}–{_num(r['tps_max'])}",
    ),
    Column("× plain", ("speedup_vs_plain",), lambda r: _num(r["speedup_vs_plain"], 2, "x")),
    Column("× HF", ("speedup_vs_hf",), lambda r: _num(r["speedup_vs_hf"], 2, "x")),
    Column("accept", ("acceptance_rate",), lambda r: _pct(r["acceptance_rate"])),
    Column("tok/step", ("mean_accepted_length",), lambda r: _num(r["mean_accepted_length"])),
    Column("draft share", ("draft_share",), lambda r: _pct(r["draft_share"])),
    Column("fallback", ("fallback_rate",), lambda r: _pct(r["fallback_rate"])),
    Column("mean K", ("mean_k",), lambda r: _num(r["mean_k"], 1)),
    Column(
        "= greedy",
        ("greedy_equal", "greedy_compared"),
        lambda r: _count(r["greedy_equal"], r["greedy_compared"]),
    ),
    Column(
        "= HF greedy",
        ("hf_greedy_equal", "hf_greedy_compared"),
        lambda r: _count(r["hf_greedy_equal"], r["hf_greedy_compared"]),
    ),
    Column("predicted", ("predicted_speedup",), lambda r: _num(r["predicted_speedup"], 2, "x")),
    Column("efficiency", ("efficiency",), lambda r: _pct(r["efficiency"])),
)


def cell(column: Column, row: RowData) -> str:
    return column.render(row)


def _table(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return out


def _curve_json(curve: CostCurve) -> dict[str, Any]:
    return {
        "sizes": list(curve.sizes),
        "seconds": list(curve.seconds),
        "relative": [s / curve.seconds[0] for s in curve.seconds],
    }


def results_json(
    *,
    command: str,
    config: dict[str, Any],
    environment: dict[str, Any],
    schedule: dict[str, Any],
    curves: dict[str, dict[str, CostCurve]],  # dtype -> runtime -> curve
    rows: Sequence[Row],
    mismatches: Sequence[Mismatch],
    measurements: Sequence[Measurement],
    notes: Sequence[str],
    timing: dict[str, float],
) -> dict[str, Any]:
    return {
        "command": command,
        "config": config,
        "environment": environment,
        "schedule": schedule,
        "timing": timing,
        "curves": {
            dtype: {runtime: _curve_json(c) for runtime, c in per.items()}
            for dtype, per in curves.items()
        },
        "rows": [dataclasses.asdict(r) for r in rows],
        "mismatches": [dataclasses.asdict(m) for m in mismatches],
        "notes": list(notes),
        "measurements": [
            {**{k: v for k, v in dataclasses.asdict(m).items() if k != "result"}, **_raw(m)}
            for m in measurements
        ],
    }


def _raw(m: Measurement) -> dict[str, Any]:
    data = dataclasses.asdict(m.result)
    data["tokens"] = list(m.result.tokens)
    data["ks"] = list(m.result.ks)
    data["new_tokens"] = len(m.result.tokens)
    return data


def markdown(data: dict[str, Any]) -> str:
    """The README-ready report, made from ``results_json``'s output only."""
    rows: list[RowData] = data["rows"]
    schedule = data["schedule"]
    lines = [
        "# spectune bench",
        "",
        f"Command: `{data['command']}`",
        "",
        f"Target `{data['config']['target']}`; {schedule['prompts']} prompts "
        f"({', '.join(schedule['categories'])}), {schedule['repeats']} repetition(s), "
        f"{data['config']['max_tokens']} new tokens at most; "
        f"{data['environment'].get('machine', '')}.",
        "Tokens/s are end to end (prefill included); speedups are ratios of medians. "
        "Columns are defined in `spectune.bench.summary`.",
    ]
    for dtype, temperature in sorted({(r["dtype"], r["temperature"]) for r in rows}):
        subset = [r for r in rows if r["dtype"] == dtype and r["temperature"] == temperature]
        lines += ["", f"## {dtype}, temperature {temperature:g}: all prompts", ""]
        overall = [r for r in subset if r["category"] == ALL]
        lines += _table(
            [c.header for c in COLUMNS], [[cell(c, r) for c in COLUMNS] for r in overall]
        )
        categories = sorted({r["category"] for r in subset} - {ALL})
        lines += [
            "",
            f"Speedup over spectune plain decoding per category ({dtype}, T = {temperature:g}):",
            "",
        ]
        by_key = {(r["system"], r["category"]): r for r in subset}
        body = []
        for r in overall:
            body.append(
                [r["system"]]
                + [
                    _num(by_key[(r["system"], c)]["speedup_vs_plain"], 2, "x")
                    for c in categories + [ALL]
                ]
            )
        lines += _table(["system", *categories, ALL], body)
        lines += _positions_section(subset, categories)
        lines += _head_to_head(overall, dtype, temperature)
    lines += _runtime_section(rows) + _curve_section(data["curves"])
    lines += ["", "## Greedy equality", ""]
    if data["mismatches"]:
        lines.append("Outputs that differ from their reference (first differing token):")
        lines.append("")
        for m in data["mismatches"]:
            lines.append(
                f"- {m['system']} ({m['dtype']}), prompt {m['prompt_id']}, repeat {m['repeat']}: "
                f"differs from {m['reference']} at token {m['first_difference']} "
                f"(expected {m['expected']}, got {m['got']}; lengths "
                f"{m['expected_length']}/{m['got_length']})"
            )
    else:
        lines.append("Every greedy output equals its reference token for token.")
    if data["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in data["notes"]]
    return "\n".join(lines) + "\n"


def _positions_section(subset: Sequence[RowData], categories: Sequence[str]) -> list[str]:
    """Acceptance at each draft position (fixed-K chains): overall, then the first draft
    token per category."""
    chains = [r for r in subset if r["policy"] == "fixed" and r["acceptance_by_position"]]
    overall = [r for r in chains if r["category"] == ALL]
    if not overall:
        return []
    depth = max(len(r["acceptance_by_position"]) for r in overall)
    by_key = {(r["system"], r["category"]): r for r in chains}
    lines = [
        "",
        "Acceptance by draft position (fixed K; position 1 = the first draft token; "
        "a tree counts its accepted path):",
        "",
    ]
    lines += _table(
        ["system", *(str(j) for j in range(1, depth + 1))],
        [
            [r["system"], *(_pct(a) for a in r["acceptance_by_position"])]
            + [""] * (depth - len(r["acceptance_by_position"]))
            for r in overall
        ],
    )
    lines += ["", "First-token acceptance per category (fixed K):", ""]
    body = []
    for r in overall:
        first = [by_key.get((r["system"], c), {}).get("acceptance_by_position") for c in categories]
        body.append([r["system"], *(_pct(f[0]) if f else "—" for f in first)])
    return lines + _table(["system", *categories], body)


def _head_to_head(overall: Sequence[RowData], dtype: str, temperature: float) -> list[str]:
    """Per drafter: spectune's best fixed K and adaptive policies against transformers with
    the same draft (assisted generation; for the n-gram drafter, prompt lookup). x plain."""
    spectune = [r for r in overall if r["family"] == "spectune"]
    policies = sorted({r["policy"] for r in spectune} - {"fixed"})
    body = []
    for drafter in dict.fromkeys(r["drafter"] for r in spectune):
        own = [r for r in spectune if r["drafter"] == drafter]
        fixed = [r for r in own if r["policy"] == "fixed"]
        best = max(fixed, key=lambda r: r["speedup_vs_plain"] or 0.0, default=None)
        line = [
            drafter,
            "—" if best is None else f"K={best['k']}: {_num(best['speedup_vs_plain'], 2, 'x')}",
        ]
        for policy in policies:
            match = [r for r in own if r["policy"] == policy]
            line.append(_num(match[0]["speedup_vs_plain"], 2, "x") if match else "—")
        if drafter == "ngram":
            hf = [r for r in overall if r["family"] == "hf-lookup"]
        else:
            hf = [r for r in overall if r["family"] == "hf-assisted" and r["drafter"] == drafter]
        default = [r for r in hf if r["policy"] in ("hf-default", "hf-lookup")]
        heuristic = [r for r in hf if r["policy"] == "hf-heuristic"]
        for match in (default, heuristic):
            line.append(_num(match[0]["speedup_vs_plain"], 2, "x") if match else "—")
        body.append(line)
    if not body:
        return []
    headers = ["drafter", "spectune best fixed K", *(f"spectune {p}" for p in policies)]
    headers += ["HF default (n-gram: prompt lookup)", "HF heuristic"]
    return [
        "",
        f"Head to head with the same drafter, speedup over spectune plain ({dtype}, "
        f"T = {temperature:g}):",
        "",
        *_table(headers, body),
    ]


def _runtime_section(rows: Sequence[RowData]) -> list[str]:
    """Plain decoding: spectune's runtime against transformers' generate(), per dtype."""
    body = []
    for dtype in sorted({r["dtype"] for r in rows}):
        temperature = min(r["temperature"] for r in rows if r["dtype"] == dtype)
        pick = {
            r["system"]: r
            for r in rows
            if r["dtype"] == dtype and r["temperature"] == temperature and r["category"] == ALL
        }
        plain, hf = pick.get("spectune plain"), pick.get("HF generate")
        if plain is None or hf is None:
            continue
        body.append(
            [
                dtype,
                _num(plain["tokens_per_second"]),
                _num(hf["tokens_per_second"]),
                _num(
                    plain["tokens_per_second"] / hf["tokens_per_second"]
                    if hf["tokens_per_second"]
                    else None,
                    2,
                    "x",
                ),
            ]
        )
    if not body:
        return []
    return [
        "",
        "## Plain decoding: spectune runtime vs transformers generate()",
        "",
        *_table(["dtype", "spectune tok/s", "HF generate tok/s", "spectune / HF"], body),
    ]


def _curve_section(curves: dict[str, dict[str, Any]]) -> list[str]:
    body = []
    sizes: list[int] = []
    for dtype, per in sorted(curves.items()):
        for runtime, curve in sorted(per.items()):
            sizes = curve["sizes"]
            cells = [
                f"{1000 * s:.1f} ms ({rel:.2f}x)"
                for s, rel in zip(curve["seconds"], curve["relative"], strict=True)
            ]
            body.append([dtype, runtime, *cells])
    if not body:
        return []
    return [
        "",
        "## Verification cost: one target forward over n tokens (time, and relative to one)",
        "",
        *_table(["dtype", "runtime", *(f"{n} tok" for n in sizes)], body),
    ]


def json_text(data: Mapping[str, Any]) -> str:
    """``data`` as JSON with one line per top-level key and, for a list of records (the
    rows, the raw measurements), one line per record: a diff shows which call changed, and
    the file is about half the size of an indented dump (a bench of a few thousand calls
    with their per-step lists is megabytes; results are committed)."""

    def compact(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))

    def field(key: str, value: Any) -> str:
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            records = ",\n".join(f"  {compact(v)}" for v in value)
            return f" {json.dumps(key)}: [\n{records}\n ]"
        return f" {json.dumps(key)}: {compact(value)}"

    return "{\n" + ",\n".join(field(k, v) for k, v in data.items()) + "\n}\n"


def write_results(out: Path, data: dict[str, Any]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "results.json", out / "results.md"
    json_path.write_text(json_text(data))
    md_path.write_text(markdown(data))
    return json_path, md_path
