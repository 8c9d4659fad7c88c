"""A tuned setup, and how it is read from the result files spectune writes.

A tuned setup is a draft, a K and the batch size above which speculation stops paying.
``read_tunings`` takes them from a result file, tolerating the shapes spectune writes:

- ``spectune select`` JSON: ``{"target": ..., "recommendation": {"draft": ..., "k": ...}}``
- ``spectune bench`` ``results.json``: ``{"config": {...}, "rows": [{"system", "drafter",
  "k", "speedup_vs_plain", "category", ...}]}``: every spectune row with a draft and a fixed
  K, ranked by mean speedup (categories and temperatures pooled; only the ``all`` rows where
  the file has them), so that an engine that cannot load the best draft gets the best one
  it can (``spectune.engines.export.export_best``).
- any JSON with top-level (or ``recommendation``) keys ``draft``/``drafter``, ``k``,
  ``speculate_max_batch`` (alias ``disable_by_batch_size``), and optionally
  ``k_by_batch_size`` ``{"1": 5, "8": 2, "16": 0}``: the threshold is then the largest
  batch size before the first K of 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.errors import InvalidParameterError

__all__ = ["Tuning", "read_tuning", "read_tunings"]


@dataclass(frozen=True)
class Tuning:
    """A tuned speculative setup (what ``select``/``bench`` recommend)."""

    draft: str | None  # a draft spec as spectune takes it (path, name, "ngram", ...); None: none
    k: int
    speculate_max_batch: int | None = None  # no speculation above this many running requests
    target: str | None = None
    source: str | None = None  # where it came from, for the notes
    speedup: float | None = None  # the mean speedup it measured in ``source``, where it says

    @property
    def label(self) -> str:
        """``DRAFT K=k``, with the measured speedup where known (for notes)."""
        measured = "" if self.speedup is None else f" ({self.speedup:.2f}x in spectune)"
        return f"{self.draft} K={self.k}{measured}"


def _int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InvalidParameterError(f"{what} must be an integer, got {value!r}")
    return int(value)


def _threshold_from_ks(ks: Mapping[str, Any]) -> int | None:
    """Largest batch size before the first K of 0 (None: K never drops to 0)."""
    try:
        pairs = sorted((int(size), int(k)) for size, k in ks.items())
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError("k_by_batch_size must map batch sizes to K") from exc
    previous: int | None = None
    for size, k in pairs:
        if k == 0:
            return previous if previous is not None else 0
        previous = size
    return None


def _from_keys(data: Mapping[str, Any], source: str) -> Tuning | None:
    scopes = [data]
    if isinstance(data.get("recommendation"), Mapping):
        scopes.insert(0, data["recommendation"])
    found: dict[str, Any] = {}
    for scope in scopes:
        for key, names in (
            ("draft", ("draft", "drafter")),
            ("k", ("k", "num_speculative_tokens")),
            ("limit", ("speculate_max_batch", "disable_by_batch_size")),
            ("ks", ("k_by_batch_size",)),
        ):
            for name in names:
                if key not in found and scope.get(name) is not None:
                    found[key] = scope[name]
    if "k" not in found and "ks" not in found:
        return None
    ks = found.get("ks")
    limit = _int(found.get("limit"), "speculate_max_batch")
    k = _int(found.get("k"), "k")
    if isinstance(ks, Mapping):
        limit = limit if limit is not None else _threshold_from_ks(ks)
        if k is None:
            smallest = min(ks, key=lambda size: int(size))
            k = _int(ks[smallest], "k")
    target = data.get("target")
    return Tuning(
        draft=str(found["draft"]) if found.get("draft") is not None else None,
        k=k or 0,
        speculate_max_batch=limit,
        target=target if isinstance(target, str) else None,
        source=source,
    )


def _from_bench_rows(data: Mapping[str, Any], source: str) -> list[Tuning]:
    """Every (drafter, K) of the spectune rows, best mean speedup first."""
    rows = [
        r
        for r in data.get("rows", [])
        if isinstance(r, Mapping)
        and r.get("drafter")
        and isinstance(r.get("k"), int)
        and isinstance(r.get("speedup_vs_plain"), int | float)
        and str(r.get("system", "spectune")).startswith("spectune")
    ]
    pooled = [r for r in rows if r.get("category") == "all"] or rows
    # Mean speedup per (drafter, K) over categories, temperatures and precisions.
    scores: dict[tuple[str, int], list[float]] = {}
    for r in pooled:
        scores.setdefault((str(r["drafter"]), int(r["k"])), []).append(float(r["speedup_vs_plain"]))
    config = data.get("config")
    target = config.get("target") if isinstance(config, Mapping) else None
    ranked = sorted(scores.items(), key=lambda item: -sum(item[1]) / len(item[1]))
    return [
        Tuning(
            draft,
            k,
            target=target if isinstance(target, str) else None,
            source=source,
            speedup=sum(speedups) / len(speedups),
        )
        for (draft, k), speedups in ranked
    ]


def read_tunings(path: Path) -> list[Tuning]:
    """The tuned setups in a ``select`` or ``bench`` result file, best first (see the module
    docstring); one for every shape but a bench run's rows."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise InvalidParameterError(f"no such result file: {path}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidParameterError(f"{path} is not a readable JSON file: {exc}") from exc
    if not isinstance(data, Mapping):
        raise InvalidParameterError(f"{path} holds no JSON object")
    keyed = _from_keys(data, str(path))
    tunings = [keyed] if keyed is not None else _from_bench_rows(data, str(path))
    if not tunings:
        raise InvalidParameterError(
            f"{path} holds no recommendation: expected 'recommendation': {{'draft', 'k'}} "
            "(spectune select), 'rows' (spectune bench) or top-level 'draft' and 'k'"
        )
    return tunings


def read_tuning(path: Path) -> Tuning:
    """The best tuned setup in a ``select`` or ``bench`` result file."""
    return read_tunings(path)[0]
