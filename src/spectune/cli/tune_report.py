"""``spectune tune``'s report: the figures as JSON-ready data, as markdown and on the console.

Every figure comes from the search (``spectune.control.tune.TuneResult``) and, when the
prompt-set mode confirmed the choice, from the held-out runs; nothing here computes a rate
that the search did not.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectune.control.tune import TuneResult
    from spectune.control.workload import StepCosts, Workload


__all__ = ["CONFIRM_SYSTEMS", "print_summary", "report_data", "report_markdown"]

CONFIRM_SYSTEMS = ("plain", "seed", "best fixed K", "tuned")


def _why(key: str, result: TuneResult, workload: Workload) -> str:
    from spectune.control.tune import K_KEYS, MIN_GAIN, seed_params

    seed, best = seed_params(), result.best
    if best[key] == seed[key]:
        if key == "hot_temperature" and not any(t > 0 for t in workload.temperatures):
            return "kept: not searched, the workload is greedy only"
        table = key.split(".")[0] if "." in key else None
        if table is not None and table not in best["checks"]:
            return f"kept: not searched, the {table} check is off"
        return f"kept: no value beat it by {MIN_GAIN:.1%} on this workload"
    revert = result.reverts.get(key)
    if revert is None:
        return "changed: the seed's value does not combine with the other tuned values"
    tuned, old = result.predicted.tokens_per_second, revert.tokens_per_second
    gain = (tuned / old - 1.0) * 100 if old else 0.0
    what = "the seed's K bounds" if key in K_KEYS else "the seed's value"
    return f"changed: with {what} {old:.3g} tokens/s predicted, tuned {tuned:.3g} ({gain:+.1f}%)"


def report_data(
    args: argparse.Namespace,
    context: dict[str, Any],
    workload: Workload,
    costs: StepCosts,
    result: TuneResult,
    confirm: dict[str, Any] | None,
    notes: list[str],
) -> dict[str, Any]:
    from spectune.control.tune import RULES, seed_params

    seed = seed_params()
    plain = result.plain.tokens_per_second

    def show(value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    def predicted(tps: float) -> dict[str, float]:
        return {"tokens_per_second": round(tps, 2), "speedup": round(tps / plain, 3)}

    best_k = result.best_fixed_k
    return {
        "command": args.command_line,
        **context,
        "policy_file": str(args.out),
        "requests": len(workload.timelines),
        "tokens": sum(t.tokens for t in workload.timelines),
        "workload": {
            "pooled_acceptance": round(workload.pooled_rate, 4),
            "known_outcomes": round(workload.known_fraction, 4),
            "position_acceptance": [round(c, 4) for c in workload.position_acceptance[:8]],
            "tree_steps_left_out": workload.tree_steps,
        },
        "costs": {
            "source": costs.source,
            "verify_seconds": {n: round(costs.verify.time(n), 6) for n in range(1, 10)},
            "draft_fixed_seconds": round(costs.draft_fixed, 6),
            "draft_seconds_per_token": round(costs.draft_per_token, 6),
            "overhead_plain_seconds": round(costs.overhead_plain, 6),
            "overhead_speculative_seconds": round(costs.overhead_speculative, 6),
        },
        "evaluated": result.evaluated,
        "predicted": {
            "tuned": predicted(result.predicted.tokens_per_second),
            "seed": predicted(result.seed.tokens_per_second),
            "best fixed K": {"k": best_k, **predicted(result.fixed[best_k].tokens_per_second)},
            "plain": predicted(plain),
            "fixed": {k: round(p.tokens_per_second, 2) for k, p in result.fixed.items()},
        },
        "parameters": [
            {
                "option": key,
                "rule": RULES[key],
                "seed": show(seed[key]),
                "tuned": show(result.best[key]),
                "why": _why(key, result, workload),
            }
            for key in seed
        ],
        "confirm": confirm,
        "notes": notes,
    }


def report_markdown(data: dict[str, Any]) -> str:
    lines = [
        "# spectune tune",
        "",
        f"Command: `{data['command']}` ({data['seconds']} s). "
        f"Policy file: `{data['policy_file']}`.",
        "",
        f"Workload: {data['requests']} request(s), {data['tokens']} tokens; pooled acceptance "
        f"{data['workload']['pooled_acceptance']:.0%}, outcomes known for "
        f"{data['workload']['known_outcomes']:.0%} of the positions; acceptance by draft "
        f"position {data['workload']['position_acceptance']}. "
        "Costs: "
        + ("verification curve measured here." if data["costs"]["source"] == "measured" else "")
        + ("fitted from the traces' times." if data["costs"]["source"] == "trace" else ""),
        "",
        "## Predicted (replay of the tuning workload)",
        "",
        "| policy | tokens/s | speedup over plain |",
        "|---|---:|---:|",
    ]
    for name in ("tuned", "seed", "best fixed K", "plain"):
        row = data["predicted"][name]
        label = f"fixed K={row['k']}" if name == "best fixed K" else name
        lines.append(f"| {label} | {row['tokens_per_second']:.3g} | {row['speedup']:.2f}x |")
    lines += ["", "## Chosen values against the seed's rules", ""]
    lines += ["| option | seed's rule | seed | tuned | why |", "|---|---|---|---|---|"]
    for p in data["parameters"]:
        lines.append(f"| `{p['option']}` | {p['rule']} | {p['seed']} | {p['tuned']} | {p['why']} |")
    confirm = data.get("confirm")
    if confirm:
        plain = confirm["measured"]["plain"]["tokens_per_second"] or 0.0
        lines += [
            "",
            f"## Measured on {len(confirm['prompts'])} held-out prompt(s), never seen by the "
            "search",
            "",
            "| policy | predicted speedup | measured tokens/s | measured speedup |",
            "|---|---:|---:|---:|",
        ]
        for name in CONFIRM_SYSTEMS:
            tps = confirm["measured"][name]["tokens_per_second"] or 0.0
            label = f"fixed K={confirm['best_fixed_k']}" if name == "best fixed K" else name
            pred = data["predicted"][name]["speedup"]
            speedup = f"{tps / plain:.2f}x" if plain else "n/a"
            lines.append(f"| {label} | {pred:.2f}x | {tps:.3g} | {speedup} |")
        if confirm["greedy_identical_to_plain"] is not None:
            lines.append("")
            lines.append(
                f"Greedy output identical to plain: {confirm['greedy_identical_to_plain']}."
            )
    for note in data["notes"]:
        lines.append(f"\nNote: {note}")
    return "\n".join(lines) + "\n"


def print_summary(data: dict[str, Any], out: Path, report: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="spectune tune: predicted on the tuning workload")
    table.add_column("policy")
    table.add_column("tokens/s", justify="right")
    table.add_column("speedup", justify="right")
    confirm = data.get("confirm")
    if confirm:
        table.add_column("measured held-out tokens/s", justify="right")
    for name in ("tuned", "seed", "best fixed K", "plain"):
        row = data["predicted"][name]
        cells = [name, f"{row['tokens_per_second']:.3g}", f"{row['speedup']:.2f}x"]
        if confirm:
            cells.append(str(confirm["measured"][name]["tokens_per_second"]))
        table.add_row(*cells)
    console.print(table)
    changed = [p for p in data["parameters"] if p["seed"] != p["tuned"]]
    for p in changed:
        console.print(f"{p['option']}: {p['seed']} -> {p['tuned']} ({p['why']})")
    if not changed:
        console.print("the seed's rules are the best found for this workload")
    for note in data["notes"]:
        console.print(f"note: {note}")
    console.print(f"wrote {out} (use it with --policy-file) and {report}")
