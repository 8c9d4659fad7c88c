"""The README's results: one benchmark run as one table and one plot.

``spectune bench --preset readme`` (``make results``) runs ``preset()`` (plain decoding and
each shipped drafter under fixed K = 2 and both adaptive policies; int4 and fp32, and the
GGUF on llama.cpp's kernels where ``spectune[llamacpp]`` is installed; T = 0 and 0.7; both
cores) and then rewrites the README between ``BEGIN`` and ``END``: the machine and
command, one row per system with tokens/s and the speedup over plain decoding of the same
runtime in each column, and how many greedy outputs equal plain decoding's. The plot is
the same speedups as a heatmap, ``speedup.png`` beside ``results.json``. The run it replaces
is its baseline: ``comparison.md`` puts the two side by side (``spectune.bench.compare``) and
the block says how many speedups stayed within noise.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectune.bench.plots import speedup_heatmap
from spectune.bench.summary import PLAIN
from spectune.errors import InvalidParameterError
from spectune.models.llamacpp import llama_cpp_available

__all__ = [
    "BEGIN",
    "Cell",
    "all_cells",
    "END",
    "preset",
    "readme_block",
    "results_block",
    "rewrite_readme",
    "runtime_name",
    "write_readme_results",
]

BEGIN = "<!-- results: make results (spectune bench --preset readme) rewrites this block -->"
END = "<!-- end of results -->"
PLOT = "speedup.png"
LLAMACPP_NOTE = (
    "`llama.cpp` columns: spectune's engine on llama.cpp's kernels (`--dtype llamacpp`; the "
    "feature-head drafts need hidden states llama.cpp does not expose). `llama.cpp ...` rows: "
    "llama-cpp-python's own decoding loop; its greedy text parts from spectune's on some "
    "prompts because llama.cpp's logits depend on how it batches the prompt "
    "([docs/usage.md](docs/usage.md))."
)
OUT = Path("docs/results/readme")
BASELINE = OUT / "results.json"
RUNTIME_ORDER = ("int4", "fp32", "bf16", "int8", "llamacpp")


def preset() -> dict[str, Any]:
    """The readme preset's options (``argparse`` destinations of ``spectune bench``); the
    llama.cpp runtime only where its optional extra is installed."""
    dtypes = ["int4", "fp32"]
    if llama_cpp_available():
        dtypes.append("llamacpp")
    return {
        "target": "default",
        "draft": ["suffix", "smollm2-draft", "hybrid"],
        "dtype": dtypes,
        "temperatures": "0,0.7",
        "k": "2",
        "policies": "cost,threshold",
        "systems": "plain,spectune,llamacpp",
        "split": "test",
        "limit_per_category": 2,
        "max_tokens": 48,
        "repeats": 1,
        "threads": 2,
        "seed": 0,
        "no_plots": True,  # the README shows one heatmap of its own
        "out": OUT,
        "readme": Path("README.md"),
        # Side by side with the run the README shows now, where there is one.
        "baseline": BASELINE if BASELINE.is_file() else None,
    }


Cell = tuple[str, str, float]  # (system, dtype, temperature)


def all_cells(data: Mapping[str, Any]) -> dict[Cell, Mapping[str, Any]]:
    """A run's rows over all categories, by (system, dtype, temperature), in run order."""
    return {
        (r["system"], r["dtype"], float(r["temperature"])): r
        for r in data["rows"]
        if r.get("category") == "all"
    }


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, float]]:
    keys = {(r["dtype"], r["temperature"]) for r in rows}
    return sorted(keys, key=lambda k: (*_runtime_rank(k[0]), k[1]))


def _label(system: str) -> str:
    return system.removeprefix("spectune ")


def _systems(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Plain decoding first, then the order the benchmark ran them."""
    seen = list(dict.fromkeys(r["system"] for r in rows))
    return sorted(seen, key=lambda s: (s != PLAIN, "llama.cpp" in s, seen.index(s)))


def runtime_name(dtype: str) -> str:
    """A runtime as tables name it: ``llamacpp`` is ``llama.cpp``, a precision itself."""
    return "llama.cpp" if dtype == "llamacpp" else dtype


def _runtime_rank(dtype: str) -> tuple[int, str]:
    rank = {name: i for i, name in enumerate(RUNTIME_ORDER)}
    return rank.get(dtype, len(rank)), dtype


def _column_name(dtype: str, temperature: float) -> str:
    return f"{runtime_name(dtype)}, T = {temperature:g}"


def readme_block(
    data: Mapping[str, Any], plot: str, today: datetime.date, comparison: str | None = None
) -> str:
    """The README's results block (between ``BEGIN`` and ``END``) for one run's
    ``results.json``; ``plot``: the heatmap's path relative to the README; ``comparison``: a
    line on how this run compares with the previous one (``spectune.bench.compare``)."""
    cells = all_cells(data)
    rows = list(cells.values())
    if not rows:
        raise InvalidParameterError("the results hold no rows to tabulate")
    columns = _columns(rows)
    env = data["environment"]
    schedule = data["schedule"]
    lines = [
        BEGIN,
        f"Last run {today.isoformat()} on {env['machine']}: {schedule['prompts']} test "
        f"prompts, {data['config']['max_tokens']} new tokens at most, tokens/s end to end "
        "(prefill included) and the speedup over plain decoding on the same runtime;",
        "`= greedy`: greedy (T = 0) outputs equal to plain decoding's, token for token.",
        "",
        f"Command: `{data['command']}`",
        "",
        *([comparison, ""] if comparison else []),
        "| system | " + " | ".join(_column_name(*c) for c in columns) + " | = greedy |",
        "|---|" + "---:|" * len(columns) + "---:|",
    ]
    for system in _systems(rows):
        line = [_label(system)]
        equal = compared = 0
        for dtype, temperature in columns:
            row = cells.get((system, dtype, temperature))
            if row is None:
                line.append("")
                continue
            speedup = row["speedup_vs_plain"]
            ratio = "" if speedup is None else f" ({speedup:.2f}x)"
            line.append(f"{row['tokens_per_second']:.1f}{ratio}")
            if temperature == 0:
                equal += row["greedy_equal"]
                compared += row["greedy_compared"]
        line.append(f"{equal}/{compared}" if compared else "")
        lines.append("| " + " | ".join(line) + " |")
    if any(dtype == "llamacpp" for dtype, _ in columns):
        lines += ["", LLAMACPP_NOTE]
    lines += _curve_lines(data.get("curves", {}))
    lines += _reading_lines(rows, data.get("curves", {}))
    lines += ["", f"![Speedup over plain decoding per system and runtime]({plot})", END]
    return "\n".join(lines)


def _curve_lines(curves: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The verification-cost curve of spectune's runtime per dtype: one target pass over n
    tokens, relative to a pass over one."""
    measured = {
        dtype: runtimes["spectune"]
        for dtype, runtimes in curves.items()
        if "spectune" in runtimes and runtimes["spectune"]["sizes"]
    }
    if not measured:
        return []
    sizes = next(iter(measured.values()))["sizes"]
    lines = [
        "",
        "Verification cost, one target pass over n tokens relative to one (same run):",
        "",
        "| runtime | " + " | ".join(f"n = {n}" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for dtype in sorted(measured, key=_runtime_rank):
        curve = measured[dtype]
        by_size = dict(zip(curve["sizes"], curve["relative"], strict=True))
        cells = [f"{by_size[n]:.2f}x" if n in by_size else "" for n in sizes]
        lines.append(f"| {runtime_name(dtype)} | " + " | ".join(cells) + " |")
    return lines


def _range(values: Sequence[float], unit: str, digits: int, scale: float = 1.0) -> str:
    low, high = min(values) * scale, max(values) * scale
    if round(low, digits) == round(high, digits):
        return f"{low:.{digits}f}{unit}"
    return f"{low:.{digits}f}-{high:.{digits}f}{unit}"


def _reading_lines(
    rows: Sequence[Mapping[str, Any]], curves: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Per runtime, what the README's "when speculation pays" rests on, read off this run:
    the cost of verifying 4 and 16 tokens, the drafters' acceptance, the speedups of
    spectune's speculative systems, plain decoding's tokens/s and the fastest system."""
    lines = ["", "Per runtime, from the same run (both temperatures):", ""]
    for dtype in sorted({r["dtype"] for r in rows}, key=_runtime_rank):
        mine = [r for r in rows if r["dtype"] == dtype]
        speculative = [
            r
            for r in mine
            if r["system"].startswith("spectune ")
            and r["system"] != PLAIN
            and r["speedup_vs_plain"] is not None
        ]
        parts = []
        curve = curves.get(dtype, {}).get("spectune")
        if curve:
            by_size = dict(zip(curve["sizes"], curve["relative"], strict=True))
            costs = [(n, by_size[n]) for n in (4, 16) if n in by_size]
            if costs:
                (n, v), *more = costs
                parts.append(
                    f"a pass over {n} tokens costs {v:.2f}x a pass over one"
                    + "".join(f", over {m} tokens {w:.2f}x" for m, w in more)
                )
        accepted = [r["acceptance_rate"] for r in speculative if r.get("acceptance_rate")]
        if accepted:
            parts.append(f"acceptance {_range(accepted, '%', 0, 100)}")
        if speculative:
            speedups = [r["speedup_vs_plain"] for r in speculative]
            parts.append(f"speculation {_range(speedups, 'x', 2)} over plain decoding")
        plain = [r["tokens_per_second"] for r in mine if r["system"] == PLAIN]
        if plain:
            parts.append(f"plain decoding {_range(plain, '', 1)} tokens/s")
        best = max(mine, key=lambda r: r["tokens_per_second"])
        parts.append(
            f"fastest {_label(best['system'])} at T = {best['temperature']:g} "
            f"({best['tokens_per_second']:.1f} tokens/s)"
        )
        lines.append(f"- {runtime_name(dtype)}: " + "; ".join(parts) + ".")
    return lines


def results_block(readme: Path) -> tuple[str, int, int]:
    """The README's text and where its results block starts and ends (past ``END``);
    ``InvalidParameterError`` for a file that cannot be read or has no block."""
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"cannot read {readme}: {exc}") from exc
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise InvalidParameterError(
            f"{readme} has no results block to rewrite (a line '{BEGIN}' and, after it, '{END}')"
        )
    return text, start, end + len(END)


def rewrite_readme(readme: Path, block: str) -> None:
    """Replace the README's results block (``BEGIN`` .. ``END``) with ``block``."""
    text, start, end = results_block(readme)
    readme.write_text(text[:start] + block + text[end:], encoding="utf-8")


def _plot(data: Mapping[str, Any], path: Path) -> None:
    cells = all_cells(data)
    rows = list(cells.values())
    columns = _columns(rows)
    systems = [s for s in _systems(rows) if s not in (PLAIN, "llama.cpp plain")]
    values = [
        [cells.get((s, d, t), {}).get("speedup_vs_plain") for d, t in columns] for s in systems
    ]
    names = [_column_name(d, t).replace(", ", "\n") for d, t in columns]
    title = f"Speedup over plain decoding ({data['environment']['machine']})"
    speedup_heatmap(values, [_label(s) for s in systems], names, path, title)


def _relative(path: Path, readme: Path) -> str:
    return Path(os.path.relpath(path.resolve(), readme.resolve().parent)).as_posix()


def write_readme_results(
    data: Mapping[str, Any],
    out: Path,
    readme: Path,
    today: datetime.date | None = None,
    comparison: tuple[Path, str] | None = None,
) -> Path:
    """Write the heatmap into ``out`` and the results block into ``readme``; the plot's path.
    ``comparison``: the page comparing this run with the previous one and its summary line."""
    out.mkdir(parents=True, exist_ok=True)
    plot = out / PLOT
    _plot(data, plot)
    line = None
    if comparison is not None:
        page, summary = comparison
        line = f"Against the previous run: {summary} ([side by side]({_relative(page, readme)}))"
    block = readme_block(data, _relative(plot, readme), today or datetime.date.today(), line)
    rewrite_readme(readme, block)
    return plot
