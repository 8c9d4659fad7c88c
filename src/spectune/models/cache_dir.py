"""Where spectune keeps derived files (dequantised GGUF weights, GGUF int4 codes and summaries,
converted tokenizers).

Converting a GGUF costs seconds on every load; the converted form is cached under
``$SPECTUNE_CACHE`` (default ``~/.cache/spectune``), keyed by the source file's path,
size and modification time, so an edited or replaced file is converted again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["derived_path"]


def _root() -> Path:
    return Path(os.environ.get("SPECTUNE_CACHE", Path.home() / ".cache" / "spectune"))


def derived_path(source: Path, kind: str) -> Path:
    """A cache location for ``kind`` derived from ``source`` (not created)."""
    stat = source.stat()
    key = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return _root() / kind / f"{source.stem}-{digest}"
