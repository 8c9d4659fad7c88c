"""OpenMP's wait behaviour, set before torch loads (``spectune/__init__.py`` calls
``configure``; torch reads these variables once, when its OpenMP library starts).

libgomp's waiting threads spin 300,000 rounds before they sleep. On a machine whose cores
other work shares, a spinning thread holds a core that the thread it waits for needs,
and decoding with two threads ran 3-6x slower than with one (docs/threads.md). A short
spin (``WAIT_SPINS``) keeps a quiet machine's speed and lets a waiting thread yield its
core soon. A user's own ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is left as it is.

This module imports nothing heavy: it must run before torch.
"""

from __future__ import annotations

import os

__all__ = ["WAIT_SPINS", "configure"]

# Spins before a waiting OpenMP thread sleeps (libgomp's default: 300,000).
WAIT_SPINS = 10_000


def configure() -> None:
    """Set ``GOMP_SPINCOUNT`` to ``WAIT_SPINS`` unless the user chose a wait behaviour."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(WAIT_SPINS)
