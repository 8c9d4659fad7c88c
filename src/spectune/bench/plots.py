"""PNG plots of a benchmark's rows (matplotlib, Agg: no display needed).

- ``speedup_<dtype>_T<t>.png``: speedup over spectune plain decoding, a heatmap of systems
  against categories with the figure written in each cell.
- ``tokens_per_s_vs_k_<dtype>_T<t>.png`` (when two fixed K values or more were run):
  tokens/s against fixed K, one line per drafter, with plain decoding, transformers'
  generate() and the adaptive policies as reference lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["speedup_heatmap", "write_plots"]

RowData = Mapping[str, Any]
# Adaptive policies of one drafter: its colour, told apart by the line (dotted, dash-dot,
# long dashes, ...); plain decoding keeps the gray short dashes.
_POLICY_STYLES = (":", "-.", (0, (8, 3)), (0, (1, 3)), (0, (3, 1, 1, 1, 1, 1)))


def _slug(dtype: str, temperature: float) -> str:
    return f"{dtype}_T{temperature:g}"


def _speedup_plot(rows: Sequence[RowData], path: Path, title: str) -> bool:
    """Speedup per category: one row per system, one column per category and "all". False
    (no file) when plain decoding ran alone."""
    categories = sorted({r["category"] for r in rows} - {"all"}) + ["all"]
    systems = [
        r["system"] for r in rows if r["category"] == "all" and r["system"] != "spectune plain"
    ]
    if not systems:
        return False
    by_key = {(r["system"], r["category"]): r for r in rows}
    values = [
        [by_key.get((system, c), {}).get("speedup_vs_plain") for c in categories]
        for system in systems
    ]
    columns = [c.replace("_", " ") for c in categories]
    speedup_heatmap(values, systems, columns, path, title, last_apart=True)
    return True


def speedup_heatmap(
    values: Sequence[Sequence[float | None]],
    systems: Sequence[str],
    columns: Sequence[str],
    path: Path,
    title: str,
    *,
    last_apart: bool = False,
) -> None:
    """A heatmap of speedups (``values[system][column]``, None: not run), the figure written
    in each cell; green above plain decoding, red below, white at 1.0x. ``last_apart``: a
    line sets the last column (a total) apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    grid = [[float("nan") if v is None else v for v in row] for row in values]
    finite = [v for row in grid for v in row if v == v] or [1.0]
    spread = max(0.05, max(abs(v - 1.0) for v in finite))
    norm = TwoSlopeNorm(vcenter=1.0, vmin=1.0 - spread, vmax=1.0 + spread)
    fig, ax = plt.subplots(
        figsize=(
            2.2 + 1.15 * len(columns) + 0.06 * max(len(s) for s in systems or [""]),
            1.2 + 0.36 * max(1, len(systems)),
        ),
    )
    image = ax.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value == value:  # not NaN
                ax.text(j, i, f"{value:.2f}x", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(columns)), list(columns))
    ax.set_yticks(range(len(systems)), list(systems), fontsize=8)
    ax.tick_params(axis="x", labeltop=True, labelbottom=False, rotation=0, labelsize=8)
    if last_apart:
        ax.axvline(len(columns) - 1.5, color="black", linewidth=1.0)
    ax.set_title(title, pad=24)
    fig.colorbar(image, ax=ax, label="speedup over spectune plain decoding (x)", shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _k_plot(rows: Sequence[RowData], path: Path, title: str) -> bool:
    import matplotlib.pyplot as plt

    overall = [r for r in rows if r["category"] == "all"]
    fixed = [r for r in overall if r["family"] == "spectune" and r["policy"] == "fixed"]
    if len({r["k"] for r in fixed}) < 2:  # a curve against K needs two K values at least
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    drafters = sorted({r["drafter"] for r in fixed})
    for drafter in drafters:
        points = sorted((r["k"], r["tokens_per_second"]) for r in fixed if r["drafter"] == drafter)
        line = ax.plot(
            [k for k, _ in points], [t for _, t in points], marker="o", label=f"{drafter} fixed K"
        )
        adaptive = [
            r
            for r in overall
            if r["family"] == "spectune" and r["drafter"] == drafter and r["policy"] != "fixed"
        ]
        for style, r in zip(_POLICY_STYLES, adaptive, strict=False):
            ax.axhline(
                r["tokens_per_second"],
                color=line[0].get_color(),
                linestyle=style,
                linewidth=1.2,
                label=f"{drafter} {r['policy']}",
            )
    for r in overall:
        if r["family"] in ("spectune-plain", "hf-generate"):
            ax.axhline(
                r["tokens_per_second"],
                color="gray",
                linestyle="--" if r["family"] == "spectune-plain" else "-.",
                label=r["system"],
            )
    ax.set_xticks(sorted({r["k"] for r in fixed}))
    ax.set_xlabel("K (draft tokens per step)")
    ax.set_ylabel("tokens/s (median)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def write_plots(out: Path, rows: Sequence[RowData]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for dtype, temperature in sorted({(r["dtype"], r["temperature"]) for r in rows}):
        subset = [r for r in rows if r["dtype"] == dtype and r["temperature"] == temperature]
        label = f"{dtype}, temperature {temperature:g}"
        path = out / f"speedup_{_slug(dtype, temperature)}.png"
        if _speedup_plot(subset, path, f"Speedup per category ({label})"):
            written.append(path)
        path = out / f"tokens_per_s_vs_k_{_slug(dtype, temperature)}.png"
        if _k_plot(subset, path, f"Tokens/s against K ({label})"):
            written.append(path)
    return written
