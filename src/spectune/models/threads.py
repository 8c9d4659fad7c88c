"""How many CPU threads the model runtimes use: the cores other processes leave idle.

On a small machine that other work shares, two threads where one of the cores is taken
decode 3-6x slower than one thread (docs/threads.md, measured by
``scripts/busy-machine.py``). OpenMP's waiting threads spin (libgomp: 300,000 rounds before
they sleep), so each parallel region waits for the thread that has no core while its
partner burns the other one. A shorter spin did not help under a steady load (int4 with
10,000 rounds: 22 tokens/s against 33 at 300,000 and 90 on one thread), and a passive wait
cost int4 44% on a quiet machine. What holds the speed is the thread count: unless
``--threads`` (or ``OMP_NUM_THREADS``) fixes it, the ``ThreadGovernor`` gives torch (and
llama.cpp, which follows torch's count) the cores that other processes leave idle. At
most once per ``interval`` it reads how busy the CPUs were (``/proc/stat``) less this
process's own CPU time, and calls ``torch.set_num_threads`` between decoding steps.

``torch.set_num_threads`` is per calling thread under OpenMP, so the governor acts from
``pace()``, which the decoding engines call on the thread that decodes, before each step.
"""

from __future__ import annotations

import math
import time

import torch

from spectune.models.machine import CoreSample, idle_cores, usable_cores

__all__ = ["ThreadGovernor", "adapt_threads", "fix_threads", "governor", "pace"]

# A core counts as taken once other processes use this share of it.
TAKEN_SHARE = 0.3


class ThreadGovernor:
    """Keeps torch's CPU thread count at the cores other processes leave idle.

    ``pace()`` is cheap (one clock read) except once per ``interval``, when it samples
    the CPU counters and, if the free core count changed, calls ``torch.set_num_threads``
    with it (at least 1, at most ``max_threads``). A core counts as taken once other
    processes use ``TAKEN_SHARE`` of it.
    """

    def __init__(self, max_threads: int, *, interval: float = 1.0) -> None:
        self.max_threads = max(1, max_threads)
        self.interval = interval
        self.last = CoreSample.read()

    def threads_for(self, idle: float) -> int:
        """The thread count for ``idle`` free cores."""
        free = math.ceil(idle - (1.0 - TAKEN_SHARE) - 1e-9)
        return max(1, min(self.max_threads, free))

    def pace(self) -> None:
        if self.last is not None and time.monotonic() - self.last.wall >= self.interval:
            self.follow()

    def follow(self) -> None:
        """Sample the counters now and set the thread count for the cores left idle since
        the last sample."""
        now = CoreSample.read()
        if self.last is None or now is None:
            return
        wanted = self.threads_for(idle_cores(self.last, now, usable_cores()))
        self.last = now
        if wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)


_governor: ThreadGovernor | None = None


def governor() -> ThreadGovernor | None:
    """The active governor, or None when the thread count is fixed."""
    return _governor


def adapt_threads(max_threads: int | None = None) -> ThreadGovernor:
    """Let the thread count follow the idle cores, up to ``max_threads`` (default: the
    usable cores); starts at the cores idle over a short first look (0.1 s)."""
    global _governor
    gov = ThreadGovernor(max_threads or usable_cores())
    if gov.last is not None:
        time.sleep(0.1)
        gov.follow()
    _governor = gov
    return gov


def fix_threads(threads: int) -> None:
    """A fixed thread count (``--threads``): the governor stops."""
    global _governor
    _governor = None
    torch.set_num_threads(threads)


def pace() -> None:
    """Between decoding steps, on the thread that decodes: let the governor adapt."""
    if _governor is not None:
        _governor.pace()
