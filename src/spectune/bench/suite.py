"""One benchmark run: loaded workbenches and prompts in, results.json/.md and PNGs out.

Steps: (1) each target's verification-cost curve (measured at loading); (2) warm every system up,
estimate the run time from those calls and trim to the budget, up front; (3) run every
system interleaved under a live view; (4) summarize, write the files, print the headline table.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markdown import Markdown

from spectune.bench.assemble import Workbench
from spectune.bench.live import LiveBoard
from spectune.bench.plan import BenchConfig, BenchPrompt, fit_budget
from spectune.bench.plots import write_plots
from spectune.bench.report import markdown, results_json, write_results
from spectune.bench.runner import (
    Measurement,
    Schedule,
    estimate_seconds,
    run_interleaved,
    warm_up,
)
from spectune.bench.summary import summarize
from spectune.bench.systems import SystemInfo
from spectune.models.devices import cpu_name
from spectune.models.machine import LoadMeter

__all__ = ["environment", "run_suite"]


def environment() -> dict[str, Any]:
    import transformers

    cpu = cpu_name()
    cores = os.cpu_count() or 0
    return {
        "cpu": cpu,
        "cores": cores,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": f"{cpu}, {cores} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}",
    }


def _system_infos(workbenches: Sequence[Workbench]) -> list[SystemInfo]:
    infos: dict[str, SystemInfo] = {}
    for workbench in workbenches:
        for system in workbench.systems:
            infos.setdefault(system.info.name, system.info)
    return list(infos.values())


def run_suite(
    config: BenchConfig,
    workbenches: Sequence[Workbench],
    prompts: Sequence[BenchPrompt],
    *,
    out: Path,
    console: Console,
    command: str,
    plots: bool = True,
) -> dict[str, Any]:
    start = time.perf_counter()
    notes = [note for w in workbenches for note in w.notes]
    # 1. Costs on this machine, measured when the workbenches were loaded.
    curves = {w.dtype: w.curves for w in workbenches}

    # 2. Warm every system up (untimed for the results), estimate from those calls, and
    #    fit the budget, before anything is timed.
    schedule = Schedule(
        tuple(prompts), config.temperatures, config.repeats, config.max_tokens, config.seed
    )
    warm = [warm_up(w, schedule) for w in workbenches]

    def estimate(candidates: Sequence[BenchPrompt], repeats: int) -> float:
        return sum(
            estimate_seconds(per, len(candidates), repeats, config.max_tokens) for per in warm
        )

    budget = None if config.budget_minutes is None else 60 * config.budget_minutes
    budgeted = fit_budget(prompts, config.repeats, estimate, budget)
    notes += budgeted.notes
    for note in budgeted.notes:
        console.print(f"[yellow]{note}[/yellow]")
    schedule = Schedule(
        tuple(budgeted.prompts),
        config.temperatures,
        budgeted.repeats,
        config.max_tokens,
        config.seed,
    )
    infos = _system_infos(workbenches)
    total = schedule.calls_per_system * sum(len(w.systems) for w in workbenches)
    console.print(
        f"{len(infos)} systems x {len(schedule.prompts)} prompts x "
        f"{len(schedule.temperatures)} temperature(s) x {schedule.repeats} repetition(s) x "
        f"{len(workbenches)} dtype(s) = {total} calls; estimated run time "
        f"{budgeted.estimate_seconds / 60:.1f} min (from each system's warm-up call)"
    )

    # 3. Run, interleaved, under the live view, watching the machine's load beside it.
    run_start = time.perf_counter()
    meter = LoadMeter()
    measurements: list[Measurement] = []
    with LiveBoard(console, infos, total) as board:
        for workbench in workbenches:
            measurements += run_interleaved(workbench, schedule, board.update)
    run_seconds = time.perf_counter() - run_start
    load = meter.stop()
    if load.busy:
        notes.append(load.line("the benchmark"))
        console.print(f"[yellow]{notes[-1]}[/yellow]")

    # 4. Summarize and write.
    rows, mismatches = summarize(
        measurements, infos, {dtype: per["spectune"] for dtype, per in curves.items()}
    )
    data = results_json(
        command=command,
        config=config.to_json(),
        environment=environment(),
        schedule={
            "prompts": len(schedule.prompts),
            "prompt_ids": [p.id for p in schedule.prompts],
            "categories": sorted({p.category for p in schedule.prompts}),
            "repeats": schedule.repeats,
            "temperatures": list(schedule.temperatures),
            "systems": [dataclasses.asdict(s) for s in infos],
        },
        curves=curves,
        rows=rows,
        mismatches=mismatches,
        measurements=measurements,
        notes=notes,
        timing={
            "estimate_seconds": budgeted.estimate_seconds,
            "run_seconds": run_seconds,
            "session_seconds": time.perf_counter() - start,
        },
    )
    data["machine_load"] = load.as_json()
    json_path, md_path = write_results(out, data)
    pictures = write_plots(out, data["rows"]) if plots else []
    console.print(Markdown(markdown(data)))
    console.print(
        f"wrote {json_path}, {md_path} and {len(pictures)} plot(s); run took "
        f"{run_seconds / 60:.1f} min (estimated {budgeted.estimate_seconds / 60:.1f})"
    )
    if mismatches:
        console.print(f"[red]{len(mismatches)} greedy output(s) differ from their reference[/red]")
    return data
