"""The JSON-lines step trace (``--trace FILE``) and its reader.

One JSON object per line, told apart by ``event``:

- ``request``  a request begins: ``request`` (its id) and ``info`` (policy name,
               temperature, drafter, target, the prompt's token ids as ``prompt`` (since
               2026-12-07; ``spectune advise --traces`` replays them), baseline tokens/s
               when known, ...). A
               later ``request`` event with the same id adds to its info (``generate
               --compare`` records the plain-decoding rate it measured after the run).
- ``step``     one per engine step: every ``StepRecord`` field (``emitted`` as a list of
               token ids; ``num_draft_tokens``, named ``drafted`` in traces written before
               2026-12, which the reader still takes; ``verify_peak_bytes``, the
               verification's peak memory, see ``spectune.models.devices.VerifyMemory``;
               ``shadow_hit``, a plain step's checked guess, see ``StepPlan.shadow``),
               ``overhead_time``, ``fallback_kind``
               (the reason's kind, see ``spectune.monitor.stats``), and ``policy``: the
               policy's state after it observed the step (K it will ask next, window
               acceptance, phases of the fallback checks, ...).
- ``end``      the request is done: ``summary``, its statistics snapshot.

Readers skip events they do not know, so later versions can add some.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from spectune.control.base import PolicyState
from spectune.errors import SpectuneError
from spectune.monitor.stats import StatsSnapshot, fallback_kind
from spectune.records import StepRecord

__all__ = ["TraceError", "TraceRequest", "TraceStep", "TraceWriter", "read_trace", "to_json"]


class TraceError(SpectuneError):
    """A trace file is missing, unreadable or not a spectune step trace."""


def to_json(value: Any) -> Any:
    """Dataclasses, mappings and tuples as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(StepRecord))


class TraceWriter:
    """Appends trace events to a file (or an open text stream); safe across threads.

    ``autoflush`` (default): every event is on disk when its call returns, so a crash or
    ^C keeps every finished step. Without it events wait in the file's buffer until
    ``flush`` (or ``close``): a writer that hears many steps at once (a batch's) flushes
    once per batch step instead of once per request.
    """

    def __init__(self, target: str | Path | IO[str], *, autoflush: bool = True) -> None:
        if isinstance(target, str | Path):
            try:
                self._file: IO[str] = open(target, "w", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                raise TraceError(f"cannot write trace {target}: {exc.strerror}") from exc
            self._owned = True
        else:
            self._file, self._owned = target, False
        self.autoflush = autoflush
        self._lock = threading.Lock()

    def _write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            if self.autoflush:
                self._file.flush()  # a crash or ^C still leaves every finished step on disk

    def flush(self) -> None:
        """Put every event written so far on disk."""
        with self._lock:
            self._file.flush()

    def request_started(self, request: str, info: Mapping[str, Any]) -> None:
        self._write({"event": "request", "request": request, "info": to_json(info)})

    def step(self, request: str, record: StepRecord, policy: PolicyState | None) -> None:
        event: dict[str, Any] = {"event": "step", "request": request}
        # A record's fields are JSON values already (``emitted``, a tuple, is written as a
        # list): what ``to_json`` gives, without its per-field dispatch on every step.
        event.update({name: getattr(record, name) for name in _RECORD_FIELDS})
        event["overhead_time"] = record.step_time - record.draft_time - record.target_time
        event["fallback_kind"] = fallback_kind(record.fallback)
        event["policy"] = dict(policy) if policy is not None else None
        self._write(event)

    def request_finished(
        self, request: str, summary: StatsSnapshot, *, cancelled: bool = False
    ) -> None:
        event = {"event": "end", "request": request, "summary": to_json(summary)}
        self._write({**event, "cancelled": cancelled})

    def close(self) -> None:
        if self._owned:
            self._file.close()
        elif not self.autoflush:
            self.flush()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class TraceStep:
    record: StepRecord
    policy: PolicyState | None


@dataclass
class TraceRequest:
    request: str
    info: dict[str, Any] = field(default_factory=dict)
    steps: list[TraceStep] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    cancelled: bool = False  # ended before its finish reason (the client went away)


_INT_FIELDS = ("index", "k", "num_draft_tokens", "accepted")
_TIME_FIELDS = ("draft_time", "target_time", "step_time")
_TEXT_FIELDS = ("fallback", "finish_reason")


def _record(event: dict[str, Any]) -> StepRecord:
    """A ``StepRecord`` from a step event, its field types checked."""
    if "num_draft_tokens" not in event and "drafted" in event:
        # Traces written before the field's rename (StepRecord.drafted, 2026-12) name it
        # "drafted"; they still load. New traces write "num_draft_tokens".
        event = {**event, "num_draft_tokens": event["drafted"]}
    for name in _INT_FIELDS:
        if not isinstance(event[name], int) or isinstance(event[name], bool):
            raise ValueError(f"{name} must be an integer")
    for name in _TIME_FIELDS:
        if not isinstance(event[name], int | float) or isinstance(event[name], bool):
            raise ValueError(f"{name} must be a number")
    for name in _TEXT_FIELDS:
        if event.get(name) is not None and not isinstance(event[name], str):
            raise ValueError(f"{name} must be a string or null")
    emitted = event["emitted"]
    if not isinstance(emitted, list) or not all(isinstance(t, int) for t in emitted):
        raise ValueError("emitted must be a list of token ids")
    return StepRecord(
        index=event["index"],
        k=event["k"],
        num_draft_tokens=event["num_draft_tokens"],
        accepted=event["accepted"],
        emitted=tuple(emitted),
        draft_time=float(event["draft_time"]),
        target_time=float(event["target_time"]),
        step_time=float(event["step_time"]),
        fallback=event.get("fallback"),
        finish_reason=event.get("finish_reason"),
        verify_groups=_groups(event.get("verify_groups", 1)),  # absent in older traces
        tree_depth=_count(event.get("tree_depth"), "tree_depth"),
        verify_peak_bytes=_count(event.get("verify_peak_bytes"), "verify_peak_bytes"),
        shadow_hit=_flag(event.get("shadow_hit"), "shadow_hit"),
    )


def _flag(value: Any, name: str) -> bool | None:
    """An optional boolean field (absent in older traces)."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be true, false or null")
    return value


def _count(value: Any, name: str) -> int | None:
    """An optional non-negative integer field (absent in older traces)."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{name} must be a non-negative integer or null")
    return value


def _groups(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("verify_groups must be a positive integer")
    return value


def read_trace(path: str | Path) -> list[TraceRequest]:
    """The requests of a trace, in the order they began; steps in file order."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.readlines()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:  # a binary file given as a trace
        raise TraceError(f"{path} is not a spectune trace (not UTF-8 text: {exc.reason})") from exc
    requests: dict[str, TraceRequest] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError("not an object")
            kind = event.get("event")
            request = requests.setdefault(
                str(event.get("request")), TraceRequest(str(event.get("request")))
            )
            if kind == "request":  # a repeated one adds to the info (a baseline measured later)
                request.info.update(event.get("info") or {})
            elif kind == "step":
                request.steps.append(TraceStep(_record(event), event.get("policy")))
            elif kind == "end":
                request.summary = event.get("summary")
                request.cancelled = event.get("cancelled") is True  # absent in older traces
        except (ValueError, TypeError, KeyError) as exc:  # KeyError: a field is missing
            raise TraceError(f"{path}:{number}: not a spectune trace event ({exc})") from exc
    if not any(r.steps for r in requests.values()):
        raise TraceError(f"{path}: no steps in this trace")
    return list(requests.values())
