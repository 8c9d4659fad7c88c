"""What the machine is doing besides us: CPU counters, and the load other processes put on
the cores while something is measured.

Every figure spectune measures (the verification-cost curve, bench, advise, tune) is
taken on the machine at hand. When other processes take a core, the figure measures the
contention as much as the model (docs/threads.md: decoding 3-6x slower with one of two
cores busy under libgomp's default spin-wait). ``LoadMeter`` records, over a
measurement, the load average before and after and the cores other processes used (the
machine's busy time on this process's CPUs less the CPU time of this process and the
processes it started), so that a
measurement can say it was disturbed instead of passing the disturbance off as a result.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BUSY_CORES",
    "CoreSample",
    "busy_cores",
    "LoadMeter",
    "LoadRecord",
    "idle_cores",
    "load_average",
    "usable_cores",
]

# A measurement counts as disturbed when other processes used this many cores, on
# average, while it ran (a shell, an editor or a log shipper stay well under it).
# ``SPECTUNE_BUSY_CORES`` overrides it: a machine with a steady background load may allow
# more; 0 counts every measurement as disturbed.
BUSY_CORES = 0.3


def busy_cores() -> float:
    """The threshold in force: ``SPECTUNE_BUSY_CORES`` where set, else ``BUSY_CORES``."""
    value = os.environ.get("SPECTUNE_BUSY_CORES")
    try:
        return BUSY_CORES if value is None else float(value)
    except ValueError:
        return BUSY_CORES


def usable_cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The one-minute load average, or None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class CoreSample:
    """CPU time counters at one instant, in seconds: the machine's busy time on this
    process's CPUs, this process's own CPU time (with ``read(descendants=True)``, its
    descendants' too), and the wall clock."""

    busy: float
    own: float
    wall: float

    @staticmethod
    def read(stat: Path = Path("/proc/stat"), *, descendants: bool = False) -> CoreSample | None:
        """The counters now, or None where ``/proc/stat`` cannot be read (not Linux).
        ``descendants``: the processes this one started count as its own time (a
        measurement's servers are its own work; for the thread count, which runs between
        decoding steps, they take cores like anyone else's)."""
        try:
            lines = stat.read_text(encoding="ascii").splitlines()
        except OSError:
            return None
        try:
            mine = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        except AttributeError:
            mine = set()
        rows = [fields for fields in map(str.split, lines) if fields and fields[0] in mine]
        if not rows:  # per-CPU lines missing: the machine-wide one
            rows = [fields for fields in map(str.split, lines[:1]) if fields[:1] == ["cpu"]]
        if not rows:
            return None
        busy = 0
        for fields in rows:
            # user nice system idle iowait irq softirq steal: stolen time was not ours either
            counts = [int(x) for x in fields[1:9]]
            busy += sum(counts) - counts[3] - counts[4]
        tick = os.sysconf("SC_CLK_TCK")
        own = os.times()
        ours = own.user + own.system
        if descendants:
            ours += own.children_user + own.children_system + _descendants_ticks() / tick
        return CoreSample(busy / tick, ours, time.monotonic())


def _descendants_ticks(proc: Path = Path("/proc")) -> int:
    """CPU time of this process's live descendants, in clock ticks: the servers a
    measurement starts (vLLM's engine and workers, llama-server) are its own work, not
    other processes' load. Finished children count through ``os.times`` once waited for."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid ... utime stime: comm may hold spaces and parentheses
        fields = text[text.rfind(")") + 2 :].split()
        try:
            parents[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
        except (IndexError, ValueError):
            continue
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0, list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def others_cores(before: CoreSample, after: CoreSample) -> float:
    """Cores that other processes kept busy, on average, between two samples."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, (after.busy - before.busy) - (after.own - before.own)) / wall


def idle_cores(before: CoreSample, after: CoreSample, cores: int) -> float:
    """How many of ``cores`` other processes left idle between two samples."""
    return max(0.0, cores - others_cores(before, after))


@dataclass(frozen=True)
class LoadRecord:
    """The machine's load over one measurement."""

    cores: int  # CPUs this process could use
    others_cores: float | None  # cores other processes used, on average; None: unknown
    load_before: float | None  # one-minute load averages
    load_after: float | None
    seconds: float

    @property
    def busy(self) -> bool:
        """Other processes took enough CPU to change what was measured."""
        return self.others_cores is not None and self.others_cores >= busy_cores()

    def line(self, what: str) -> str:
        """One line for the user: whether ``what`` ran on a quiet or a busy machine."""
        if self.others_cores is None:
            return f"{what}: the machine's load could not be read"
        load = ""
        if self.load_before is not None and self.load_after is not None:
            load = f"; load average {self.load_before:.2f} -> {self.load_after:.2f}"
        used = f"other processes used {self.others_cores:.2f} of {self.cores} cores{load}"
        if self.busy:
            return f"{what} ran on a busy machine ({used}): its timings measure the contention too"
        return f"{what} ran on a quiet machine ({used})"

    def as_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "others_cores": None if self.others_cores is None else round(self.others_cores, 3),
            "load_before": self.load_before,
            "load_after": self.load_after,
            "seconds": round(self.seconds, 2),
            "busy": self.busy,
        }


class LoadMeter:
    """Records the machine's load from ``start()`` (or construction) to ``stop()``."""

    def __init__(self) -> None:
        self.load_before = load_average()
        self.first = CoreSample.read(descendants=True)
        self.started = time.monotonic()

    def stop(self) -> LoadRecord:
        last = CoreSample.read(descendants=True)
        others = None if self.first is None or last is None else others_cores(self.first, last)
        return LoadRecord(
            usable_cores(),
            others,
            self.load_before,
            load_average(),
            time.monotonic() - self.started,
        )
