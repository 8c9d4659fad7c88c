"""Stages of the evidence run, each cached as ``stage-<name>.json`` in the output folder.

A cached stage is reused when its recorded settings equal the settings asked for now
(``--force`` reruns it anyway); otherwise it is measured again and the file replaced.
The file records the stage's running time, which the report states.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["StageRun", "run_stage", "stage_path"]


@dataclass(frozen=True)
class StageRun:
    name: str
    data: dict[str, Any]  # what the stage measured (JSON types only)
    seconds: float  # running time when it was measured
    cached: bool  # True: read from its file, not measured in this run


def stage_path(out_dir: Path, name: str) -> Path:
    return out_dir / f"stage-{name}.json"


def run_stage(
    out_dir: Path,
    name: str,
    settings: Mapping[str, Any],
    measure: Callable[[], dict[str, Any]],
    *,
    force: bool = False,
) -> StageRun:
    """The stage's results: from its file when present with the same ``settings`` (and not
    ``force``), else measured now and written."""
    path = stage_path(out_dir, name)
    wanted = json.loads(json.dumps(dict(settings)))  # as it will read back (tuples -> lists)
    if path.is_file() and not force:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("settings") == wanted:
            return StageRun(name, record["data"], float(record["seconds"]), cached=True)
    start = time.perf_counter()
    data = measure()
    seconds = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"stage": name, "settings": wanted, "seconds": round(seconds, 2), "data": data}
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return StageRun(name, json.loads(json.dumps(data)), seconds, cached=False)
