"""The live view while a benchmark runs: a progress bar over a running table (rich)."""

from __future__ import annotations

from collections import defaultdict
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from spectune.bench.runner import Measurement
from spectune.bench.systems import SystemInfo
from spectune.records import SpecCounts

__all__ = ["LiveBoard"]


class LiveBoard:
    """Pooled tokens/s, speedup, acceptance and greedy equality so far, per system, for the
    dtype and temperature being run. The final numbers come from ``summary``, not from here."""

    def __init__(self, console: Console, systems: list[SystemInfo], total_calls: int) -> None:
        self.console = console
        self.systems = systems
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task("benchmark", total=total_calls)
        self.section: tuple[str, float] | None = None
        self._reset()
        self.live = Live(self._render(), console=console, refresh_per_second=2)

    def _reset(self) -> None:
        self.tokens: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, SpecCounts] = defaultdict(SpecCounts)  # speculative systems
        self.equal: dict[str, list[bool]] = defaultdict(list)
        self.reference: dict[str, tuple[int, ...]] = {}

    def __enter__(self) -> LiveBoard:
        self.live.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.live.__exit__(kind, value, traceback)

    def update(self, m: Measurement) -> None:
        if self.section != (m.dtype, m.temperature):
            self.section = (m.dtype, m.temperature)
            self._reset()
        name, result = m.system, m.result
        self.tokens[name] += len(result.tokens)
        self.seconds[name] += result.seconds
        if result.drafted is not None:
            self.counts[name].merge(
                SpecCounts(positions=result.drafted, accepted=result.accepted or 0)
            )
        if m.temperature == 0.0:
            if name == "spectune plain" and m.prompt_id not in self.reference:
                self.reference[m.prompt_id] = result.tokens
            expected = self.reference.get(m.prompt_id)
            if expected is not None:
                self.equal[name].append(expected == result.tokens)
        self.progress.update(
            self.task, advance=1, description=f"{m.dtype} T={m.temperature:g} {m.prompt_id}"
        )
        self.live.update(self._render())

    def _render(self) -> Group:
        where = "" if self.section is None else f"{self.section[0]}, T = {self.section[1]:g}"
        table = Table(title=f"so far: {where}", expand=False)
        for header in ("system", "tok/s", "× plain", "accept", "= greedy"):
            table.add_column(header, justify="left" if header == "system" else "right")
        plain_rate = self._rate("spectune plain")
        for info in self.systems:
            rate = self._rate(info.name)
            counts = self.counts.get(info.name)
            acceptance = None if counts is None else counts.acceptance_rate
            equal = self.equal.get(info.name, [])
            table.add_row(
                info.name,
                "—" if rate is None else f"{rate:.2f}",
                "—" if rate is None or not plain_rate else f"{rate / plain_rate:.2f}x",
                "—" if acceptance is None else f"{100 * acceptance:.0f}%",
                "—" if not equal else f"{sum(equal)}/{len(equal)}",
            )
        return Group(self.progress, table)

    def _rate(self, name: str) -> float | None:
        seconds = self.seconds.get(name, 0.0)
        return self.tokens.get(name, 0) / seconds if seconds > 0 else None
