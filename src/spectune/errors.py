"""Typed exceptions. Every message is one line a user can act on; the CLI prints it as is."""

from __future__ import annotations

__all__ = [
    "BatchFullError",
    "DrafterError",
    "IncompatibleModelsError",
    "InvalidParameterError",
    "ModelLoadError",
    "PromptError",
    "SpectuneError",
    "SpectuneWarning",
]


class SpectuneError(Exception):
    """Base class: anything spectune raises on purpose."""


class InvalidParameterError(SpectuneError, ValueError):
    """A sampling or engine parameter is outside its valid range."""


class ModelLoadError(SpectuneError):
    """A model file or folder is missing, unreadable, corrupt or of an unsupported kind."""


class IncompatibleModelsError(SpectuneError):
    """Draft and target cannot be paired (vocabulary, special tokens, token strings)."""


class PromptError(SpectuneError, ValueError):
    """The prompt is empty or does not fit the model's context."""


class DrafterError(SpectuneError):
    """A drafter raised or returned something the verifier cannot use."""


class BatchFullError(SpectuneError):
    """Every row of a batch is taken; retry after a sequence finishes."""


class SpectuneWarning(UserWarning):
    """A check an expert flag switched off, or a run that works but not as asked (one line;
    the CLI prints it as ``spectune: warning: ...``)."""
