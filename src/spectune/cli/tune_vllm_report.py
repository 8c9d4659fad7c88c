"""What ``spectune tune --engine vllm`` shows: its tables (rich on the terminal, markdown in
the report) and its plot, all read from the report's JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["markdown", "plot", "print_tables", "tables"]


def _speedup(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.2f}x" + ("" if se is None else f" ±{se:.2f}")


def tables(data: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the screen and the confirmation."""
    levels = [str(c) for c in data["levels"]]
    screen_rows = []
    for name, entry in data["screen"].items():
        cells = [
            f"{entry['levels'][c]['tokens_per_second']:.1f} ({entry['ratio'][c]:.2f}x)"
            for c in levels
        ]
        drafted = sum(entry["levels"][c]["draft_tokens"] for c in levels)
        accepted = sum(entry["levels"][c]["accepted"] for c in levels)
        acceptance = f"{accepted / drafted:.0%}" if drafted else "-"
        screen_rows.append(
            [name + (" (vLLM default)" if entry["builtin"] else ""), *cells, acceptance]
        )
    confirm_rows = []
    for name, entry in data["confirm"].items():
        cells = []
        for c in levels:
            cell = entry["levels"][c]
            rate = f"{cell['mean']:.1f}" + ("" if cell["se"] is None else f" ±{cell['se']:.1f}")
            cells.append(
                rate if name == "off" else f"{rate} ({_speedup(cell['ratio'], cell['ratio_se'])})"
            )
        accepts = [entry["levels"][c]["acceptance"] for c in levels]
        shown = [f"{a:.0%}" for a in accepts if a is not None]
        confirm_rows.append(
            [name, *cells, "/".join(shown) or "-", entry.get("greedy_equal_to_off", "-")]
        )
    heads = [f"c={c} tok/s" for c in levels]
    rounds = data["rounds"]
    return [
        (
            "screen: development prompts, one pass (tokens/s of the batch, ratio to off)",
            ["configuration", *heads, "accepted"],
            screen_rows,
        ),
        (
            f"confirmation: held-apart prompts, {rounds} interleaved round(s) "
            "(mean ± standard error over rounds)",
            ["configuration", *heads, "accepted by c", "greedy = off"],
            confirm_rows,
        ),
    ]


def _schedule_lines(data: dict[str, Any]) -> list[str]:
    lines = []
    if data["family"] is not None:
        lines.append(
            f"screened best: {data['family']}, K by concurrency "
            + ", ".join(f"c={c}: {k}" for c, k in data["screen_k"].items())
        )
    schedule = data["schedule"]
    if schedule is not None and schedule["ranges"] is not None:
        ranges = ", ".join(f"{a}-{b}: K={k}" for a, b, k in schedule["ranges"])
        lines.append(f"schedule (batch sizes): {ranges}")
        if schedule["dropped"]:
            dropped = ", ".join(map(str, schedule["dropped"]))
            lines.append(f"set to K=0 after confirmation (no gain beyond the noise): c={dropped}")
    return lines


def print_tables(console: Any, data: dict[str, Any]) -> None:
    from rich.table import Table

    for title, header, rows in tables(data):
        table = Table(title=title)
        for i, column in enumerate(header):
            table.add_column(column, justify="left" if i == 0 else "right", no_wrap=i == 0)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for line in _schedule_lines(data):
        console.print(line)


def markdown(data: dict[str, Any]) -> str:
    out = [
        "# tune --engine vllm",
        "",
        f"written by: `{data['written_by']}`",
        "",
        f"target `{data['target']}`, {data['max_tokens']} tokens per request, temperature "
        f"{data['temperature']:g}, {'streamed' if data['stream'] else 'not streamed'}, "
        f"noise: {data['noise_z']:g} standard errors; {data['seconds']:.0f} s",
        "",
    ]
    for title, header, rows in tables(data):
        out += [f"## {title}", "", "| " + " | ".join(header) + " |"]
        out.append("|" + "---|" * len(header))
        out += ["| " + " | ".join(row) + " |" for row in rows]
        out.append("")
    out += [f"- {line}" for line in _schedule_lines(data)]
    config = data["speculative_config"]
    out.append(
        "- keep speculation off"
        if config is None
        else f"- `--speculative-config '{_json(config)}'`"
    )
    out += [f"- note: {note}" for note in data["notes"]]
    return "\n".join(out) + "\n"


def _json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


def plot(data: dict[str, Any], path: Path) -> None:
    """Speedup over off against concurrency, one line per configuration: the confirmed ones
    solid with their standard errors, the screened ones thin and dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = data["levels"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, entry in data["screen"].items():
        if name == "off":
            continue
        ys = [entry["ratio"][str(c)] for c in levels]
        ax.plot(levels, ys, linestyle="--", linewidth=0.8, alpha=0.5, label=f"screen: {name}")
    for name, entry in data["confirm"].items():
        if name == "off":
            continue
        cells = [entry["levels"][str(c)] for c in levels]
        ax.errorbar(
            levels,
            [cell["ratio"] for cell in cells],
            yerr=[cell["ratio_se"] or 0 for cell in cells],
            marker="o",
            linewidth=2,
            capsize=3,
            label=f"confirmed: {name}",
        )
    ax.axhline(1.0, color="black", linewidth=1, label="off")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency (clients)")
    ax.set_ylabel("tokens/s over off")
    ax.set_title("vLLM speculation: speedup against concurrency")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
