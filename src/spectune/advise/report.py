"""The advice as a terminal table and one plot of predicted vs measured speedup."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from spectune.advise.schema import Advice

__all__ = ["checklist_table", "config_table", "engine_table", "plot", "position_table"]


def config_table(advice: Advice) -> Table:
    table = Table(title=f"spectune advise: {advice.target}")
    for column in (
        "configuration",
        "alpha",
        "c",
        "v(K)",
        "break-even",
        "predicted",
        "measured",
        "error",
    ):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for result in advice.configurations:
        p = result.prediction
        even = p.break_even.get(p.k)
        measured = (
            "-" if result.run is None else f"{result.run.speedup:.2f}x +-{result.run.noise:.2f}"
        )
        table.add_row(
            p.label,
            f"{p.alpha:.0%}",
            f"{p.draft_cost:.3f}",
            f"{p.verify_cost:.2f}",
            "never" if even is None else f"{even:.0%}",
            f"{p.predicted_speedup:.2f}x",
            measured,
            "-" if result.error is None else f"{result.error:+.0%}",
        )
    return table


def position_table(advice: Advice) -> Table:
    """Per drafter and temperature: first-token acceptance (select's measurement) and each
    draft position's acceptance given the earlier ones (the probe runs)."""
    probed = [c for c in advice.candidates if c.position_acceptance]
    width = max((len(curve) for c in probed for curve in c.position_acceptance.values()), default=0)
    table = Table(title="acceptance by draft position (probe runs)")
    table.add_column("drafter")
    table.add_column("T", justify="right")
    table.add_column("alpha", justify="right")
    for j in range(width):
        table.add_column(f"pos {j + 1}", justify="right")
    for check in probed:
        for temperature, curve in check.position_acceptance.items():
            alpha = check.acceptance.get(temperature)
            table.add_row(
                check.spec,
                temperature,
                "-" if alpha is None else f"{alpha:.0%}",
                *(f"{c:.0%}" for c in curve),
            )
    return table


def engine_table(advice: Advice) -> Table | None:
    """The configuration vLLM ran, as each engine measured it: spectune's runtime (decoding
    steps' tokens/s, prefill excluded) and vLLM (requests' tokens/s, prefill included)."""
    check = advice.engine_check
    if check is None:
        return None
    table = Table(
        title=f"{check.configuration} on each engine (held-apart prompts)",
        caption="tokens/s: spectune's of decoding steps (prefill excluded), vLLM's of whole "
        "requests (prefill included)",
    )
    for column in ("measured on", "plain tok/s", "speculative tok/s", "speedup", "acceptance"):
        table.add_column(column, justify="left" if column == "measured on" else "right")
    run = check.screened
    if run is not None:
        table.add_row(
            f"spectune (--runtime {check.runtime}), {check.prediction.label}",
            _rate(run.plain.tokens_per_second),
            _rate(run.counts.tokens_per_second),
            f"{run.speedup:.2f}x +-{run.noise:.2f}",
            _share(run.counts.acceptance_rate),
        )
    replay = check.replay
    if replay is not None and check.measured:
        counts = replay.counts
        table.add_row(
            f"vLLM, {check.configuration}",
            _rate(replay.plain.tokens_per_second),
            _rate(replay.speculative.tokens_per_second),
            f"{replay.speedup:.2f}x +-{check.noise:.2f}",
            _share(None if counts is None else counts.acceptance_rate),
        )
    else:
        table.add_row(f"vLLM, {check.configuration}", "-", "-", "not measured", "-")
    return table


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def checklist_table(advice: Advice) -> Table:
    table = Table(title="health rules")
    for column in ("rule", "band", "measured", ""):
        table.add_column(column)
    for row in advice.checklist:
        mark = "n/a" if row.met is None else ("met" if row.met else "not met")
        table.add_row(row.rule, row.band, row.shown(), mark)
    return table


def plot(advice: Advice, path: Path) -> None:
    """Predicted and measured speedup per verified configuration, with the noise as error
    bars and plain decoding as the line at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    verified = [r for r in advice.configurations if r.run is not None]
    labels = [r.prediction.label for r in verified]
    positions = range(len(verified))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(verified) + 2), 3.6))
    width = 0.38
    ax.bar(
        [x - width / 2 for x in positions],
        [r.prediction.predicted_speedup for r in verified],
        width,
        label="predicted",
        color="#9ecae1",
    )
    ax.bar(
        [x + width / 2 for x in positions],
        [r.measured or 0.0 for r in verified],
        width,
        yerr=[r.run.noise if r.run else 0.0 for r in verified],
        capsize=4,
        label="measured (+-noise)",
        color="#3182bd",
    )
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="plain decoding")
    ax.set_xticks(list(positions), labels)
    ax.set_ylabel("speedup over plain")
    ax.set_title(f"{advice.target}: {advice.verdict.summary}", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
