"""How a selection is shown: a ranked rich table, JSON, Markdown and two plots.

The JSON carries ``recommendation: {draft, k, predicted_speedup, measured_speedup}`` and
``candidates: [...]``; ``spectune export`` reads those keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spectune.select.selector import CandidateResult, SelectionReport

__all__ = ["render_notes", "render_table", "short_name", "to_json", "write_report"]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _candidate_json(c: CandidateResult) -> dict[str, Any]:
    return {
        "draft": c.spec,
        "kind": c.kind,
        "compatible": c.compatible,
        "problems": list(c.problems),
        "num_parameters": c.num_parameters,
        "parameter_ratio": c.size.ratio,
        "size_verdict": c.size.verdict,
        "size_warning": c.size.warning,
        "alpha": [
            {
                "temperature": a.temperature,
                "overall": a.overall,
                "positions": a.positions,
                "per_category": a.per_category,
                "coverage": a.coverage,
            }
            for a in c.alpha
        ],
        "draft_cost": c.draft_cost,
        "optimal_k": c.best_k,
        "predicted_speedup": c.predicted_speedup,
        "predicted_speedup_by_k": {str(k): v for k, v in c.predicted_curve.items()},
        "measured": {
            str(k): {
                "speedup": c.measured_speedup.get(k),
                "acceptance_rate": run.acceptance_rate,
                "tokens_per_second": run.tokens_per_second,
                "tokens": run.tokens,
            }
            for k, run in c.runs.items()
        },
    }


def to_json(report: SelectionReport) -> dict[str, Any]:
    rec = report.recommendation
    return {
        "target": report.target,
        "target_parameters": report.target_parameters,
        "prompts": report.prompts,
        "prompt_format": report.settings.prompt_format,
        "continuation_positions": report.continuation_positions,
        "verify_curve": {
            "sizes": list(report.verify_curve.sizes),
            "seconds": list(report.verify_curve.seconds),
        },
        "baseline_tokens_per_second": report.baseline_tokens_per_second,
        "recommendation": {
            "draft": rec.draft,
            "k": rec.k,
            "predicted_speedup": rec.predicted_speedup,
            "measured_speedup": rec.measured_speedup,
            "reasons": list(rec.reasons),
        },
        "candidates": [_candidate_json(c) for c in report.candidates],
        "seconds": report.seconds,
    }


def short_name(spec: str) -> str:
    """A path's last component (with its parent when that is ``draft``): tables stay narrow."""
    parts = Path(spec).parts
    if len(parts) <= 1:
        return spec
    return "/".join(parts[-2:]) if parts[-1] == "draft" else parts[-1]


def render_table(report: SelectionReport) -> Any:
    """The ranked table; size warnings and incompatibility reasons go in ``render_notes``."""
    from rich.table import Table

    table = Table(title=f"Drafts for {report.target} (ranked by predicted speedup)")
    headers = (
        "#",
        "draft",
        "kind",
        "ratio",
        "α T=0",
        "α T=0.7",
        "α T=1",
        "c",
        "K*",
        "predicted",
        "measured",
        "acc. run",
    )
    for column in headers:
        table.add_column(column, justify="left" if column in ("draft", "kind") else "right")
    for rank, c in enumerate(report.candidates, 1):
        name = short_name(c.spec)
        if not c.compatible:
            table.add_row("-", name, "[red]incompatible", *[""] * (len(headers) - 3))
            continue
        measured = c.confirmed_speedup
        run = c.runs.get(c.best_k)
        ratio = "-" if c.size.ratio is None else f"1/{1 / c.size.ratio:.0f}"
        table.add_row(
            str(rank),
            name,
            c.kind,
            ratio,
            _fmt(c.alpha_at(0.0)),
            _fmt(c.alpha_at(0.7)),
            _fmt(c.alpha_at(1.0)),
            _fmt(c.draft_cost, 3),
            str(c.best_k),
            _fmt(c.predicted_speedup) + "x",
            _fmt(measured) + ("x" if measured else ""),
            "-" if run is None else _fmt(run.acceptance_rate),
        )
    return table


def render_notes(report: SelectionReport) -> list[str]:
    notes = []
    for c in report.candidates:
        if not c.compatible:
            notes.append(f"{short_name(c.spec)}: incompatible: {'; '.join(c.problems)}")
        elif c.size.warning:
            notes.append(f"{short_name(c.spec)}: {c.size.warning}")
        if c.alpha and c.alpha[0].coverage < 1.0:
            notes.append(
                f"{short_name(c.spec)}: proposes at {c.alpha[0].coverage:.0%} of positions; "
                "alpha counts those, the prediction counts the rest as plain steps"
            )
    return notes


def _plots(report: SelectionReport, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    usable = [c for c in report.candidates if c.compatible and c.alpha]
    names: list[str] = []
    if not usable:
        return names
    categories = sorted({cat for c in usable for cat in c.alpha[0].per_category})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    width = 0.8 / len(usable)
    for ax, temperature in zip(axes, (0.0, 0.7), strict=True):
        for i, c in enumerate(usable):
            estimate = next((a for a in c.alpha if a.temperature == temperature), None)
            if estimate is None:
                continue
            values = [estimate.per_category.get(cat, 0.0) for cat in categories]
            ax.bar([x + i * width for x in range(len(categories))], values, width, label=c.spec)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(categories))])
        ax.set_xticklabels(categories, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"expected acceptance α, T={temperature}")
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "alpha_per_category.png", dpi=100)
    plt.close(fig)
    names.append("alpha_per_category.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for c in usable:
        ks = sorted(c.predicted_curve)
        line = ax.plot(ks, [c.predicted_curve[k] for k in ks], label=f"{c.spec} predicted")
        measured = sorted(c.measured_speedup)
        if measured:
            ax.plot(
                measured,
                [c.measured_speedup[k] for k in measured],
                "o",
                color=line[0].get_color(),
                label=f"{c.spec} measured",
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("K (draft tokens per step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "speedup_vs_k.png", dpi=100)
    plt.close(fig)
    names.append("speedup_vs_k.png")
    return names


def _markdown(report: SelectionReport, plots: list[str]) -> str:
    rec = report.recommendation
    lines = [
        f"# Draft selection for {report.target}",
        "",
        f"{report.prompts} prompts, {report.continuation_positions} continuation positions, "
        f"{report.seconds:.0f} s. Plain decoding: "
        f"{_fmt(report.baseline_tokens_per_second, 1)} tokens/s.",
        "",
        f"**Recommendation: `{rec.draft}` with K={rec.k}** "
        f"(predicted {_fmt(rec.predicted_speedup)}x, measured {_fmt(rec.measured_speedup)}x)",
        "",
        *[f"- {reason}" for reason in rec.reasons],
        "",
        "| # | draft | kind | ratio | α T=0 | α T=0.7 | α T=1 | c | K* | predicted | measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rank, c in enumerate(report.candidates, 1):
        if not c.compatible:
            continue
        ratio = "-" if c.size.ratio is None else f"1/{1 / c.size.ratio:.0f}"
        lines.append(
            f"| {rank} | `{c.spec}` | {c.kind} | {ratio} | {_fmt(c.alpha_at(0.0))} | "
            f"{_fmt(c.alpha_at(0.7))} | {_fmt(c.alpha_at(1.0))} | {_fmt(c.draft_cost, 3)} | "
            f"{c.best_k} | {_fmt(c.predicted_speedup)}x | "
            f"{_fmt(c.confirmed_speedup)}x |"
        )
    warnings = [c for c in report.candidates if c.compatible and c.size.warning]
    if warnings:
        lines += ["", "Size warnings:", *[f"- `{c.spec}`: {c.size.warning}" for c in warnings]]
    bad = [c for c in report.candidates if not c.compatible]
    if bad:
        lines += ["", "Incompatible:", *[f"- `{c.spec}`: {'; '.join(c.problems)}" for c in bad]]
    coverage = [n for n in render_notes(report) if "proposes at" in n]
    if coverage:
        lines += ["", "Coverage:", *[f"- {note}" for note in coverage]]
    usable = [c for c in report.candidates if c.compatible and c.alpha]
    if usable:
        categories = sorted(usable[0].alpha[0].per_category)
        lines += [
            "",
            "Greedy α per category:",
            "",
            "| draft | " + " | ".join(categories) + " |",
            "|---|" + "---|" * len(categories),
        ]
        for c in usable:
            per = c.alpha[0].per_category
            lines.append(
                f"| `{c.spec}` | " + " | ".join(_fmt(per.get(k)) for k in categories) + " |"
            )
    lines += ["", *[f"![{name}]({name})" for name in plots]]
    return "\n".join(lines) + "\n"


def write_report(report: SelectionReport, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    plots = _plots(report, folder)
    json_path = folder / "select.json"
    json_path.write_text(json.dumps(to_json(report), indent=2))
    md_path = folder / "select.md"
    md_path.write_text(_markdown(report, plots))
    return {"json": json_path, "markdown": md_path, **{p: folder / p for p in plots}}
