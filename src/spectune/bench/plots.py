"""PNG plots of a benchmark's rows (matplotlib, Agg: no display needed).

- ``speedup_<dtype>_T<t>.png``: speedup over spectune plain decoding per category, one
  bar per system.
- ``tokens_per_s_vs_k_<dtype>_T<t>.png``: tokens/s against fixed K, one line per drafter,
  with plain decoding, transformers' generate() and the adaptive policies as reference
  lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["write_plots"]

RowData = Mapping[str, Any]


def _slug(dtype: str, temperature: float) -> str:
    return f"{dtype}_T{temperature:g}"


def _speedup_plot(rows: Sequence[RowData], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    categories = sorted({r["category"] for r in rows} - {"all"}) + ["all"]
    systems = [
        r["system"] for r in rows if r["category"] == "all" and r["system"] != "spectune plain"
    ]
    by_key = {(r["system"], r["category"]): r for r in rows}
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(8.0, 1.4 * len(categories) + 0.15 * len(systems)), 5))
    palette = plt.get_cmap("tab20")  # 20 distinct colours; past 20 systems, hatching too
    for i, system in enumerate(systems):
        values = [by_key[(system, c)]["speedup_vs_plain"] or 0.0 for c in categories]
        positions = [c + (i - (len(systems) - 1) / 2) * width for c in range(len(categories))]
        hatch = ("", "//", "..", "xx")[(i // 20) % 4]
        ax.bar(positions, values, width, label=system, color=palette(i % 20), hatch=hatch)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(categories)), categories, rotation=20, ha="right")
    ax.set_ylabel("speedup over spectune plain decoding")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits outside the axes
    plt.close(fig)


def _k_plot(rows: Sequence[RowData], path: Path, title: str) -> bool:
    import matplotlib.pyplot as plt

    overall = [r for r in rows if r["category"] == "all"]
    fixed = [r for r in overall if r["family"] == "spectune" and r["policy"] == "fixed"]
    if not fixed:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    drafters = sorted({r["drafter"] for r in fixed})
    for drafter in drafters:
        points = sorted((r["k"], r["tokens_per_second"]) for r in fixed if r["drafter"] == drafter)
        line = ax.plot([k for k, _ in points], [t for _, t in points], marker="o", label=drafter)
        for r in overall:
            if r["family"] == "spectune" and r["drafter"] == drafter and r["policy"] != "fixed":
                ax.axhline(
                    r["tokens_per_second"],
                    color=line[0].get_color(),
                    linestyle=":",
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
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
        _speedup_plot(subset, path, f"Speedup per category ({label})")
        written.append(path)
        path = out / f"tokens_per_s_vs_k_{_slug(dtype, temperature)}.png"
        if _k_plot(subset, path, f"Tokens/s against K ({label})"):
            written.append(path)
    return written
