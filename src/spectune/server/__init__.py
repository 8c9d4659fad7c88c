"""OpenAI-compatible HTTP server over the speculative engine, with continuous batching.

Layout: ``app`` (the FastAPI app), ``routes`` (endpoints and response shapes),
``schemas`` (request bodies), ``service`` (request checks, streaming), ``scheduler``
(the thread that steps the batch engine), ``output`` (text, stop strings, usage),
``limits`` (limits and the API key), ``errors`` (OpenAI's error shape), ``metrics``
(Prometheus), ``sequential`` (the one-at-a-time engine), ``testing`` (test doubles).
"""

from spectune.server.app import create_app
from spectune.server.limits import Limits
from spectune.server.service import ServedModel, Service

__all__ = ["Limits", "ServedModel", "Service", "create_app"]
