"""JSON-lines files: one JSON value per non-empty line, errors naming the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spectune.errors import InvalidParameterError, ModelLoadError

__all__ = ["read_json_lines"]


def read_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-empty line; a line that is not JSON raises
    ``InvalidParameterError`` (``file:line: not JSON (...)``)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidParameterError(f"{path}:{number}: not JSON ({exc})") from exc
