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
each runtime, with the machine it was measured on (``machine_of``: the CPU, its cores and
torch's threads, or the GPU). It is the prior the ``cost`` policy starts from in
``generate``, ``serve`` and ``bench``, and what a hybrid drafter prices its merged trees
with: on int4 and llama.cpp verification is dear, and a policy that assumed a flat curve
speculated for its first steps and lost (the demo on int4: 0.78x). Its shape is the
machine's, not the model's alone: fp32 verifies 4 tokens for 0.91x one token's time on the
2-core AMD EPYC the shipped curves come from and for 1.57x on a 2-core Intel Xeon (AMX),
2 threads each. So a machine's own measurement is taken where none is recorded
(``curve_for_this_machine``, a few seconds once per machine, runtime and thread count) and a
curve recorded on another machine is not used; the shipped curve stands in only where
nothing is measured.

Keys: the target's name and parameter count, then the drafter's name (``|*`` for a value
that holds whatever drafts: an older or a draft-agnostic measurement), then the runtime
where it is not fp32 (``|int4``, ``|llamacpp``, ...: ``runtime_of``): a faster one-token
forward makes verification relatively dearer, so each runtime has its own crossover.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from spectune.control.costs import CostCurve, measure_forward_curve
from spectune.models.base import LanguageModel, ModelInfo
from spectune.models.devices import machine_of
from spectune.models.llama import COMPILED
from spectune.models.machine import LoadMeter

__all__ = [
    "CURVE_REVISION",
    "MEASURED_SIZES",
    "crossover_path",
    "curve_for_this_machine",
    "load_crossover",
    "load_verify_curve",
    "runtime_of",
    "save_crossover",
    "save_verify_curve",
    "verify_curve_of",
]

ANY_DRAFT = "*"
FP32 = "fp32"
# What a machine's recorded curve was measured with: bumped when a runtime's kernels change
# what a forward over n tokens costs, so such a record is measured again rather than trusted
# (1: unnumbered records; 2: int8 layers of 4M+ weights, the default model's output head,
# on oneDNN, 2026-12-05).
CURVE_REVISION = 2
# Tokens per forward that ``curve_for_this_machine`` times: every chain up to K = 8 plus
# its pending token, and trees of up to 16 nodes.
MEASURED_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17)


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


def _machine_key(info: ModelInfo, runtime: str, machine: str) -> str:
    """Where this machine's curve is kept: one entry per machine (thread counts apart), so
    runs with other threads do not measure over each other's curve."""
    return f"{_key(info, None, runtime)}@{machine}"


def _curve(
    data: dict[str, Any], info: ModelInfo, runtime: str, machine: str | None = None
) -> CostCurve | None:
    """The curve under ``info``/``runtime`` in ``data``; with ``machine``, only one
    measured there (its own entry, else an entry that names no machine: an older record
    of this machine) by today's kernels (``CURVE_REVISION``)."""
    entry = data.get(_machine_key(info, runtime, machine)) if machine is not None else None
    if not isinstance(entry, dict):
        entry = data.get(_key(info, None, runtime))
    if not isinstance(entry, dict):
        return None
    if machine is not None and (
        entry.get("verify_curve_machine", machine) != machine
        or entry.get("verify_curve_revision", 1) != CURVE_REVISION
    ):
        return None
    found = entry.get("verify_curve")
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


def load_verify_curve(
    info: ModelInfo, runtime: str = FP32, machine: str | None = None
) -> CostCurve | None:
    """The recorded verification-cost curve of this target on this runtime (seconds
    relative to a one-token forward): this machine's record (with ``machine``: only one
    measured on it), else the shipped one; None if never measured or unreadable."""
    return _curve(_local(), info, runtime, machine) or _curve(_shipped(), info, runtime)


def verify_curve_of(model: LanguageModel) -> CostCurve | None:
    """``load_verify_curve`` for a loaded model on the runtime and machine it runs on."""
    return load_verify_curve(model.info, runtime_of(model), machine_of(model))


def curve_for_this_machine(
    model: LanguageModel, *, repeats: int = 3, report: Callable[[str], None] | None = None
) -> CostCurve:
    """This machine's recorded verification-cost curve of ``model`` on its runtime; where
    none is recorded, measured now (``MEASURED_SIZES``, ``repeats`` interleaved rounds: a
    few seconds) and recorded for the next run. ``report`` hears one line when it measures.

    A curve measured while other processes kept the cores busy (``LoadRecord.busy``)
    serves this run but is not recorded: it prices the contention, not the model, and a
    recorded one would be trusted by every later run."""
    runtime, machine = runtime_of(model), machine_of(model)
    found = _curve(_local(), model.info, runtime, machine)
    if found is not None:
        return found
    meter = LoadMeter()
    curve = measure_forward_curve(model, MEASURED_SIZES, repeats=repeats)
    load = meter.stop()
    what = f"the verification-cost curve of {model.info.name} ({runtime})"
    if load.busy:
        if report is not None:
            report(f"{load.line(f'measuring {what}')}; used for this run, not recorded")
    else:
        detail: dict[str, object] = {
            "verify_curve_command": "measured at start-up (curve_for_this_machine)",
            "verify_curve_measured": time.strftime("%Y-%m-%d"),
            "verify_curve_load": load.as_json(),
            "verify_curve_spread": curve.spread,
        }
        path = save_verify_curve(model.info, curve, detail, runtime=runtime, machine=machine)
        if report is not None:
            report(
                f"measured {what} on this machine in {load.seconds:.1f} s, once: recorded "
                f"in {path} (delete that entry to measure it again)"
            )
    relative = tuple(t / curve.seconds[0] for t in curve.seconds)
    return CostCurve(curve.sizes, relative, curve.spread)


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
    info: ModelInfo,
    curve: CostCurve,
    detail: dict[str, object],
    *,
    runtime: str = FP32,
    machine: str,
) -> Path:
    """Record this machine's verification-cost curve of a target on a runtime (relative to
    one token), which ``load_verify_curve`` then prefers to the shipped one on ``machine``
    (``machine_of``)."""
    relative = [round(s / curve.seconds[0], 4) for s in curve.seconds]
    entry = {
        "verify_curve": {"sizes": list(curve.sizes), "relative": relative},
        "verify_curve_machine": machine,
        "verify_curve_revision": CURVE_REVISION,
        **detail,
    }
    return _store(_machine_key(info, runtime, machine), entry)


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
