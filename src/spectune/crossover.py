"""The measured batch size above which speculation stops paying, per target, per machine.

``spectune experiment batch`` measures throughput with and without speculation at batch
sizes 1..16 and records the largest size at which speculation still wins; ``BatchEngine``
reads it when no ``speculate_max_batch`` is given, so speculation turns itself off above
it. Stored as JSON under ``$SPECTUNE_CACHE`` (default ``~/.cache/spectune``, the same root
as ``spectune.cache_dir``), keyed by the target's name and parameter count.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from spectune.models.base import ModelInfo

__all__ = ["crossover_path", "load_crossover", "save_crossover"]


def crossover_path() -> Path:
    root = Path(os.environ.get("SPECTUNE_CACHE", Path.home() / ".cache" / "spectune"))
    return root / "batch_crossover.json"


def _key(info: ModelInfo) -> str:
    return f"{info.name}|{info.num_parameters}"


def load_crossover(info: ModelInfo) -> int | None:
    """The recorded ``speculate_max_batch`` for this target, or None if never measured (or
    the file is unreadable: a missing measurement must never stop decoding)."""
    try:
        data = json.loads(crossover_path().read_text(encoding="utf-8"))
        value = data[_key(info)]["speculate_max_batch"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and value >= 0 else None


def save_crossover(info: ModelInfo, speculate_max_batch: int, detail: dict[str, object]) -> Path:
    """Record the crossover (atomically: a concurrent reader never sees half a file)."""
    path = crossover_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[_key(info)] = {"speculate_max_batch": speculate_max_batch, **detail}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    tmp.replace(path)
    return path
