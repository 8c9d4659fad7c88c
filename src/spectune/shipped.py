"""Drafts that ship inside the package, addressed by name (e.g. ``smollm2-draft``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["shipped_draft_path", "shipped_drafts"]


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
