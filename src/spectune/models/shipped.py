"""Drafts that ship inside the package, addressed by name (e.g. ``smollm2-draft``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["DEFAULT_SUFFIX_INDEX", "shipped_draft_path", "shipped_drafts", "shipped_suffix_index"]

DEFAULT_SUFFIX_INDEX = "smollm2"  # the shipped suffix index of the default target


def _root() -> Path:
    return Path(str(resources.files("spectune") / "assets" / "drafts"))


def shipped_drafts() -> list[str]:
    root = _root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())


def shipped_draft_path(name: str) -> Path | None:
    """The folder of a shipped draft, or None if ``name`` is not one."""
    if "/" in name or name.startswith("."):
        return None
    path = _root() / name
    return path if (path / "config.json").is_file() else None


def shipped_suffix_index(name: str) -> Path | None:
    """The file of a shipped suffix index (``assets/suffix/<name>.npz``), or None."""
    if "/" in name or name.startswith("."):
        return None
    path = Path(str(resources.files("spectune") / "assets" / "suffix")) / f"{name}.npz"
    return path if path.is_file() else None
