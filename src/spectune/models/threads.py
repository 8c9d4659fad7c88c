"""How many CPU threads the model runtimes use, and how their idle threads wait.

On a small machine that other work shares, two facts decide the speed of decoding
(measured in docs/threads.md, by ``scripts/busy-machine.py``):

1. **Idle OpenMP threads spin.** libgomp (PyTorch's OpenMP) keeps a thread that waits at
   a barrier spinning for 300,000 rounds before it sleeps. When one of two cores is
   taken by another process, every parallel region waits for the thread that has no core
   while its partner burns the other one: decoding with two threads ran 3-6x slower
   than with one. ``spectune.openmp`` shortens the spin before torch loads.
2. **A busy core is better left alone.** Even without spinning, a thread that shares its
   core with another process makes each region wait for the slower half. So, unless
   ``--threads`` fixes the count, the ``ThreadGovernor`` gives torch (and llama.cpp,
   which follows torch's count) the cores other processes leave idle: at most once per
   ``interval`` it reads how busy the CPUs were (``/proc/stat``) less this process's
   own CPU time, and calls ``torch.set_num_threads`` between decoding steps.

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
        self.changes = 0

    def threads_for(self, idle: float) -> int:
        """The thread count for ``idle`` free cores."""
        free = math.ceil(idle - (1.0 - TAKEN_SHARE) - 1e-9)
        return max(1, min(self.max_threads, free))

    def pace(self) -> None:
        last = self.last
        if last is None or time.monotonic() - last.wall < self.interval:
            return
        now = CoreSample.read()
        if now is None:
            return
        self.last = now
        wanted = self.threads_for(idle_cores(last, now, usable_cores()))
        if wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)
            self.changes += 1


_governor: ThreadGovernor | None = None


def governor() -> ThreadGovernor | None:
    """The active governor, or None when the thread count is fixed."""
    return _governor


def adapt_threads(max_threads: int | None = None) -> ThreadGovernor:
    """Let the thread count follow the idle cores, up to ``max_threads`` (default: the
    usable cores); starts at the cores idle over a short first look (0.1 s)."""
    global _governor
    gov = ThreadGovernor(max_threads or usable_cores())
    first = gov.last
    if first is not None:
        time.sleep(0.1)
        now = CoreSample.read()
        if now is not None:
            gov.last = now
            torch.set_num_threads(gov.threads_for(idle_cores(first, now, usable_cores())))
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
