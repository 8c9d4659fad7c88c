"""The server's engine options as plain values: ``spectune serve``'s parser reads them
without loading the engines (``spectune.server.engines`` acts on them)."""

from __future__ import annotations

__all__ = ["DEFAULT_DRAFT_DEADLINE", "ENGINES", "HISTORY_SCOPES"]

ENGINES = ("batch", "sequential")
HISTORY_SCOPES = ("none", "tenant", "global")
DEFAULT_DRAFT_DEADLINE = 10.0  # seconds
