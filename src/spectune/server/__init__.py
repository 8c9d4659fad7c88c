"""OpenAI-compatible HTTP server over the speculative engine, with continuous batching.

Layout: ``app`` (the FastAPI app), ``routes`` (endpoints and response shapes),
``schemas`` (request bodies), ``service`` (request checks, streaming), ``scheduler``
(the thread that steps the batch engine), ``output`` (text, stop strings, usage),
``limits`` (limits and the API key), ``errors`` (OpenAI's error shape), ``metrics``
(Prometheus), ``engines`` (the batch engine it steps), ``run`` (binding and serving),
``shutdown`` (draining on SIGTERM), ``testing`` (test doubles).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectune.server.app import create_app
    from spectune.server.limits import Limits
    from spectune.server.service import ServedModel, Service

__all__ = ["Limits", "ServedModel", "Service", "create_app"]

# Loaded on first use: the HTTP stack (FastAPI, Starlette, pydantic) is imported only by
# what serves, so the other commands (and `spectune.server.engines`) start without it.
_HOMES = {
    "create_app": "spectune.server.app",
    "Limits": "spectune.server.limits",
    "ServedModel": "spectune.server.service",
    "Service": "spectune.server.service",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'spectune.server' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
