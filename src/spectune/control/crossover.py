"""Measured facts of a target on a runtime: the batch size above which speculation stops
paying (per draft), and the verification-cost curve.

``spectune experiment batch`` measures throughput with and without speculation at batch
sizes 1..16 and records the largest size at which speculation still wins; ``BatchEngine``
(and so the server) reads it when no ``speculate_max_batch`` is given, so speculation turns
itself off above it.

Where it is looked up, first hit wins:
1. this machine's measurements, JSON under ``$SPECTUNE_CACHE`` (default
   ``~/.cache/spectune``, the root ``spectune.models.cache_dir`` uses too);
2. the measurements shipped with spectune (``assets/crossover.json``: the embedded default
   target with the shipped draft, measured on the 2-core CPU this project is built on;
   each entry names the command that produced it).

The verification-cost curve (``load_verify_curve``: what a forward over n tokens costs
relative to one, ``spectune experiment runtimes``) is kept under the draft-agnostic key of
each runtime. It is the prior the ``cost`` policy starts from in ``generate`` and ``serve``
(the bench measures its own): on int4 and llama.cpp verification is dear, and a policy
that assumed a flat curve speculated for its first steps and lost (the demo on int4: 0.78x).

Keys: the target's name and parameter count, then the drafter's name (``|*`` for a value
that holds whatever drafts: an older or a draft-agnostic measurement), then the runtime
where it is not fp32 (``|int4``, ``|llamacpp``, ...: ``runtime_of``): a faster one-token
forward makes verification relatively dearer, so each runtime has its own crossover.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from spectune.control.costs import CostCurve
from spectune.models.base import LanguageModel, ModelInfo
from spectune.models.llama import COMPILED

__all__ = [
    "crossover_path",
    "load_crossover",
    "load_verify_curve",
    "runtime_of",
    "save_crossover",
    "save_verify_curve",
    "verify_curve_of",
]

ANY_DRAFT = "*"
FP32 = "fp32"


def runtime_of(model: object) -> str:
    """The runtime a model runs on, as ``--dtype`` names it: its ``precision`` where it
    states one (the native runtime and llama.cpp do), else fp32; "+compile" after it where
    its steps are compiled (``LlamaLM.compile_steps``)."""
    precision = getattr(model, "precision", FP32)
    name = precision if isinstance(precision, str) else FP32
    return name + COMPILED if getattr(model, "compiled_steps", False) else name


def crossover_path() -> Path:
    root = Path(os.environ.get("SPECTUNE_CACHE", Path.home() / ".cache" / "spectune"))
    return root / "batch_crossover.json"


def _key(info: ModelInfo, draft: str | None, runtime: str = FP32) -> str:
    key = f"{info.name}|{info.num_parameters}|{draft or ANY_DRAFT}"
    return key if runtime == FP32 else f"{key}|{runtime}"


def _read(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _curve(data: dict[str, Any], info: ModelInfo, runtime: str) -> CostCurve | None:
    entry = data.get(_key(info, None, runtime))
    found = entry.get("verify_curve") if isinstance(entry, dict) else None
    if not isinstance(found, dict):
        return None
    sizes, relative = found.get("sizes"), found.get("relative")
    if not isinstance(sizes, list) or not isinstance(relative, list) or not sizes:
        return None
    if len(sizes) != len(relative) or sizes[0] != 1 or sizes != sorted(set(sizes)):
        return None
    if not all(isinstance(v, int | float) and v > 0 for v in relative):
        return None
    return CostCurve(tuple(int(n) for n in sizes), tuple(float(v) for v in relative))


def load_verify_curve(info: ModelInfo, runtime: str = FP32) -> CostCurve | None:
    """The recorded verification-cost curve of this target on this runtime (seconds
    relative to a one-token forward), or None if never measured or unreadable."""
    return _curve(_local(), info, runtime) or _curve(_shipped(), info, runtime)


def verify_curve_of(model: LanguageModel) -> CostCurve | None:
    """``load_verify_curve`` for a loaded model on the runtime it runs on."""
    return load_verify_curve(model.info, runtime_of(model))


def _lookup(data: dict[str, Any], info: ModelInfo, draft: str | None, runtime: str) -> int | None:
    for key in dict.fromkeys((_key(info, draft, runtime), _key(info, None, runtime))):
        entry = data.get(key)
        value = entry.get("speculate_max_batch") if isinstance(entry, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _local() -> dict[str, Any]:
    """This machine's measurements (an unreadable file counts as none)."""
    try:
        return _read(crossover_path().read_text(encoding="utf-8"))
    except OSError:
        return {}


def _shipped() -> dict[str, Any]:
    try:
        text = resources.files("spectune").joinpath("assets/crossover.json").read_text("utf-8")
    except OSError:
        return {}
    return _read(text)


def load_crossover(info: ModelInfo, draft: str | None = None, runtime: str = FP32) -> int | None:
    """The recorded ``speculate_max_batch`` for this target, drafter and runtime, or None if
    never measured (an unreadable file counts as none: a missing measurement never stops
    decoding)."""
    found = _lookup(_local(), info, draft, runtime)
    return found if found is not None else _lookup(_shipped(), info, draft, runtime)


def save_crossover(
    info: ModelInfo,
    speculate_max_batch: int,
    detail: dict[str, object],
    draft: str | None = None,
    runtime: str = FP32,
) -> Path:
    """Record the crossover on this machine."""
    return _store(
        _key(info, draft, runtime), {"speculate_max_batch": speculate_max_batch, **detail}
    )


def save_verify_curve(
    info: ModelInfo, curve: CostCurve, detail: dict[str, object], runtime: str = FP32
) -> Path:
    """Record this machine's verification-cost curve of a target on a runtime (relative to
    one token), which ``load_verify_curve`` then prefers to the shipped one."""
    relative = [round(s / curve.seconds[0], 4) for s in curve.seconds]
    entry = {"verify_curve": {"sizes": list(curve.sizes), "relative": relative}, **detail}
    return _store(_key(info, None, runtime), entry)


def _store(key: str, fields: dict[str, object]) -> Path:
    """Merge ``fields`` into this machine's entry ``key`` (atomically: a concurrent reader
    never sees half a file)."""
    path = crossover_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = _read(path.read_text(encoding="utf-8"))
    except OSError:
        data = {}
    entry = data.get(key)
    data[key] = {**(entry if isinstance(entry, dict) else {}), **fields}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    tmp.replace(path)
    return path
