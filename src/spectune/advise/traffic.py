"""Recorded traffic as ``advise``'s prompts: ``--traces PATH`` replays the prompts that
``serve --trace`` and ``generate --trace`` recorded (their token ids, in each request's
info), at the temperatures they were served at.

Each trace file is one category (its file name's stem), so acceptance is also reported per
traffic source. A file's requests are taken evenly spaced over its length, so a long trace
is sampled over its whole span and not only at its start; repeated prompts (retries) count
once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spectune.advise.advisor import PromptRow
from spectune.monitor.trace import TraceError, TraceRequest, read_trace

__all__ = ["Traffic", "load_traffic", "trace_files"]


@dataclass(frozen=True)
class Traffic:
    prompts: list[PromptRow]
    temperatures: tuple[float, ...]  # the chosen requests' temperatures, most frequent first
    targets: dict[str, str]  # prompt id -> the target it was recorded on, where recorded
    notes: list[str]

    def check(self, target_name: str, vocab_size: int) -> None:
        """Every prompt was recorded on ``target_name`` (where the trace says) and is in its
        vocabulary; else a one-line error naming the request."""
        for row_id, _, prompt in self.prompts:
            recorded_on = self.targets.get(row_id)
            if recorded_on is not None and recorded_on != target_name:
                raise TraceError(
                    f"--traces: request {row_id} was recorded on {recorded_on!r}, not on the "
                    f"target {target_name!r}: its token ids mean other text"
                )
            outside = next((t for t in prompt if not 0 <= t < vocab_size), None)
            if outside is not None:
                raise TraceError(
                    f"--traces: request {row_id}: prompt token {outside} is outside the "
                    f"target's vocabulary ({vocab_size}); was it recorded on another model?"
                )


def trace_files(path: Path) -> list[Path]:
    """``path`` itself, or the ``*.jsonl`` files in the folder ``path``, sorted."""
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise TraceError(f"--traces {path}: no *.jsonl step traces in this folder")
        return files
    if not path.exists():
        raise TraceError(f"--traces {path}: no such file or folder")
    return [path]


def _prompt(request: TraceRequest, where: Path) -> list[int] | None:
    """The request's recorded prompt token ids; None where none was recorded."""
    prompt = request.info.get("prompt")
    if prompt is None:
        return None
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        raise TraceError(f"{where}: request {request.request}: 'prompt' is not a list of token ids")
    return list(prompt)


def _evenly(items: Sequence[PromptRow], count: int) -> list[PromptRow]:
    """``count`` of ``items`` spread evenly over them (all of them when there are fewer)."""
    if len(items) <= count:
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def load_traffic(path: Path, per_file: int) -> Traffic:
    """Up to ``per_file`` distinct recorded prompts from each trace under ``path``."""
    notes: list[str] = []
    prompts: list[PromptRow] = []
    temperatures: Counter[float] = Counter()
    targets: dict[str, str] = {}
    for file in trace_files(path):
        rows: list[PromptRow] = []
        heat: dict[str, float] = {}
        seen: set[tuple[int, ...]] = set()
        unrecorded = 0
        for request in read_trace(file):
            prompt = _prompt(request, file)
            if prompt is None:
                unrecorded += 1
                continue
            if tuple(prompt) in seen:
                continue
            seen.add(tuple(prompt))
            row_id = f"{file.stem}:{request.request}"
            rows.append((row_id, file.stem, prompt))
            temperature = request.info.get("temperature", 0.0)
            heat[row_id] = float(temperature) if isinstance(temperature, int | float) else 0.0
            if isinstance(request.info.get("target"), str):
                targets[row_id] = request.info["target"]
        if unrecorded:
            notes.append(
                f"{file.name}: {unrecorded} request(s) carry no prompt (traces written before "
                "2026-12-07 record none) and are left out"
            )
        chosen = _evenly(rows, per_file)
        prompts.extend(chosen)
        temperatures.update(heat[row[0]] for row in chosen)
    if not prompts:
        raise TraceError(
            f"--traces {path}: no request with a recorded prompt; record traffic with "
            "'spectune serve --trace FILE'"
        )
    ranked = tuple(t for t, _ in sorted(temperatures.items(), key=lambda kv: (-kv[1], kv[0])))
    return Traffic(prompts, ranked, targets, notes)
