"""The FastAPI application: routes, error handlers, limits and the scheduler's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from spectune.server.errors import install_error_handlers
from spectune.server.limits import BodySizeLimit
from spectune.server.routes import build_router
from spectune.server.service import Service

__all__ = ["create_app"]


def create_app(service: Service) -> FastAPI:
    """An app serving ``service``; its scheduler thread runs while the app does."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.scheduler.start()
        try:
            yield
        finally:
            service.scheduler.stop()

    app = FastAPI(
        title="spectune",
        summary="OpenAI-compatible server with lossless speculative decoding",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = service
    install_error_handlers(app)
    app.include_router(build_router())
    app.add_middleware(BodySizeLimit, limit=service.limits.max_body_bytes)
    return app
