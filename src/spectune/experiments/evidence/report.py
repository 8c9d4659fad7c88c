"""The evidence report: Markdown, one section per rule, with PNG plots beside it.

Every figure in the text and the plots comes from the stage data (``stages``); nothing is
measured here. Plots use one colour per series and label both axes with units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectune.experiments.evidence.rules import Finding
from spectune.experiments.evidence.stages import StageRun

__all__ = ["write_plots", "write_report"]

Stages = Mapping[str, Mapping[str, Any]]


def _figure(width: float = 6.4, height: float = 3.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _temperature(data: Mapping[str, Any], path: Path) -> None:
    fig, ax = _figure()
    temps = data["temperatures"]
    ax.plot(temps, data["alpha"], marker="o", color="black", linewidth=2.5, label="all prompts")
    colours = _colours(len(data["per_category"]))
    for colour, (category, values) in zip(colours, data["per_category"].items(), strict=True):
        ax.plot(temps, values, marker=".", color=colour, linewidth=1, label=category)
    ax.set_xlabel("sampling temperature T")
    ax.set_ylabel("expected acceptance alpha (fraction)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


def _categories(data: Mapping[str, Any], path: Path) -> None:
    fig, ax = _figure()
    temps = data["temperatures"]
    index = temps.index(0.0) if 0.0 in temps else 0
    names = list(data["per_category"])
    values = [data["per_category"][c][index] for c in names]
    colours = ["tab:red" if c == "code" else "tab:blue" for c in names]
    bars = ax.bar(names, values, color=colours)
    ax.bar_label(bars, labels=[f"{v:.0%}" for v in values], fontsize=8)
    ax.set_ylabel(f"expected acceptance alpha at T = {temps[index]:g}")
    ax.set_xlabel("prompt category")
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    _save(fig, path)


def _position(data: Mapping[str, Any], path: Path) -> None:
    fig, ax = _figure()
    starts = data["window_starts"]
    for key, label, colour in (
        ("all", "all outputs", "tab:gray"),
        ("long", "long outputs", "tab:blue"),
    ):
        drafted, accepted = data[f"drafted_{key}"], data[f"accepted_{key}"]
        points = [(s, a / d) for s, a, d in zip(starts, accepted, drafted, strict=True) if d]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", color=colour, label=label)
    ax.set_xlabel(f"output position (tokens, windows of {data['window']})")
    ax.set_ylabel(f"accepted / drafted at K = {data['k']}")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    _save(fig, path)


def _policies(data: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = data["temperatures"]
    fig, axes = plt.subplots(1, len(temps), figsize=(3.8 * len(temps), 3.8), squeeze=False)
    for ax, t in zip(axes[0], temps, strict=True):
        rows = [r for r in data["rows"] if r["temperature"] == t]
        plain = next(r for r in rows if r["policy"] == "plain")["tokens_per_second"] or 1.0
        names = [r["policy"] for r in rows]
        speed = [r["tokens_per_second"] / plain for r in rows]
        colours = [
            "tab:gray"
            if n == "plain"
            else "tab:orange"
            if n.startswith("threshold")
            else "tab:blue"
            for n in names
        ]
        bars = ax.bar(names, speed, color=colours)
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in speed], fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"T = {t:g}", fontsize=9)
        ax.set_ylabel("tokens/s over plain decoding (x)")
        ax.set_xlabel("fixed K (blue) or the seed's controller (orange)")
        ax.tick_params(axis="x", labelrotation=35, labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    _save(fig, path)


def _memory(data: Mapping[str, Any], path: Path) -> None:
    fig, ax = _figure()
    styles = (("chain", "tab:blue", "o", "-", 9), ("tree", "tab:green", "s", "--", 5))
    for kind, colour, marker, line, size in styles:
        rows = [r for r in data["rows"] if r["kind"] == kind and r["mean_peak_bytes"] is not None]
        if rows:
            ax.plot(
                [r["draft_tokens"] for r in rows],
                [r["mean_peak_bytes"] / 1e6 for r in rows],
                marker=marker,
                markersize=size,
                linestyle=line,
                color=colour,
                label="chain (K draft tokens)" if kind == "chain" else "tree (nodes)",
            )
    how = "from tensor shapes" if data["device"] == "cpu" else "allocator peak"
    ax.set_xlabel("draft tokens verified per step (chain K, tree nodes)")
    ax.set_ylabel(f"verification peak memory\n(MB, {data['device']}, {how})")
    ax.legend(fontsize=8)
    _save(fig, path)


def _trees(data: Mapping[str, Any], path: Path) -> None:
    fig, ax = _figure()
    rows = data["rows"]
    labels = [f"T={r['temperature']:g}\nn={r['budget']} w={r['width']}" for r in rows]
    x = range(len(rows))
    ax.bar(
        [i - 0.2 for i in x],
        [r["chain"]["mean_accepted_length"] for r in rows],
        0.4,
        color="tab:blue",
        label="chain",
    )
    ax.bar(
        [i + 0.2 for i in x],
        [r["tree"]["mean_accepted_length"] for r in rows],
        0.4,
        color="tab:green",
        label="tree",
    )
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("mean accepted length (tokens per step)")
    ax.set_xlabel("temperature, node budget n (= chain K), tree width w")
    ax.legend(fontsize=8)
    _save(fig, path)


def _drafts(data: Mapping[str, Any], path: Path) -> None:
    fig, ax = _figure()
    for family, colour, marker in (("llama", "tab:blue", "o"), ("gpt2", "tab:red", "s")):
        rows = sorted(
            (d for d in data["drafts"] if d["family"] == family), key=lambda d: d["ratio"]
        )
        if rows:
            ax.plot(
                [d["ratio"] for d in rows],
                [d["alpha_t0"] for d in rows],
                marker=marker,
                color=colour,
                label=f"{family}-style",
            )
    ax.axvspan(0.1, 0.25, color="tab:green", alpha=0.1, label="the rule: 1/10 to 1/4")
    ax.axvline(0.05, color="tab:gray", linestyle="--", linewidth=0.8, label="1/20")
    ax.set_xscale("log")
    ax.set_xlabel("draft parameters / target parameters (log scale)")
    ax.set_ylabel("greedy acceptance alpha (fraction)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    _save(fig, path)


def _colours(n: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i) for i in range(n)]


PLOTS = {
    "temperature.png": ("temperature", _temperature),
    "categories.png": ("temperature", _categories),
    "position.png": ("position", _position),
    "policies.png": ("policies", _policies),
    "memory.png": ("memory", _memory),
    "trees.png": ("tree", _trees),
    "drafts.png": ("drafts", _drafts),
}


def write_plots(stages: Stages, out_dir: Path) -> list[Path]:
    written = []
    for name, (stage, draw) in PLOTS.items():
        if stage in stages:
            draw(stages[stage], out_dir / name)
            written.append(out_dir / name)
    return written


def write_report(
    path: Path,
    findings: Sequence[Finding],
    runs: Sequence[StageRun],
    *,
    command: str,
    stage_command: str,
    setup: str,
    plots: Sequence[Path],
    plot_dir: str,
) -> None:
    """``stage_command``: the command with ``{stages}`` where a section's stages go;
    ``plot_dir``: the plots' folder relative to the report's."""
    total = sum(r.seconds for r in runs)
    lines = [
        "# The practice rules, measured",
        "",
        f"Produced by `{command}` ({setup}). The stages ran for {total / 60:.1f} minutes in "
        "all (their running times below, as measured when each ran; a stage read from its "
        "cache file keeps its first time). Each section gives the rule as the seed states it, "
        "the figure measured here, the command that reruns its stages, and a verdict: "
        "*holds*, *holds with a different number*, *does not hold here*, *inconclusive at "
        "this budget*, or *not run*.",
        "",
    ]
    ran = {r.name for r in runs}
    missing = sorted({n for f in findings if f.verdict == "not run" for n in f.stages} - ran)
    if missing:
        lines += [
            f"Sections marked *not run* need stages this run did not measure ({', '.join(missing)}"
            "): run the command with those `--stages` (the drafts stage distils one draft per "
            "size for `--distill-minutes` each).",
            "",
        ]
    lines += [
        "| stage | running time | file |",
        "| --- | ---: | --- |",
    ]
    for r in runs:
        lines.append(f"| {r.name} | {r.seconds:.1f} s | `stage-{r.name}.json` |")
    lines += ["", "| rule | verdict |", "| --- | --- |"]
    lines += [f"| {f.rule} | {f.verdict} |" for f in findings]
    names = {p.name for p in plots}
    for f in findings:
        lines += ["", f"## {f.title}", "", f"**Rule.** {f.rule}", ""]
        lines.append(f"**Measured.** {f.measured}")
        lines += ["", f"**Command.** `{stage_command.format(stages=','.join(f.stages))}`", ""]
        lines.append(f"**Verdict: {f.verdict}.** ({f.criterion}.)")
        if f.plot and f.plot in names:
            lines += ["", f"![{f.title}]({plot_dir}/{f.plot})"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
