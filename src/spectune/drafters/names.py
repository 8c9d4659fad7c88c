"""Drafting defaults as plain values: the parsers of ``spectune --help`` read them without
loading the drafters' kernels (the modules named beside each act on them)."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_DEPTH"]

DEFAULT_MAX_DEPTH = 32  # a suffix index's longest tail matched, in tokens (suffix_index)
