"""Every error the server answers, in OpenAI's shape:
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``.

FastAPI's own answers (validation, 404, 405, malformed JSON) are rewritten into that
shape too, so a client needs only one error parser.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from spectune.errors import SpectuneError
from spectune.server.schemas import ErrorResponse

__all__ = ["ERROR_RESPONSES", "APIError", "error_response", "install_error_handlers"]

log = logging.getLogger(__name__)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# pydantic's labels of union members that read like field names ("content.str").
_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "list", "dict"})

ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"description": text, "model": ErrorResponse}
    for code, text in (
        (400, "invalid request"),
        (401, "missing or wrong API key"),
        (404, "unknown model"),
        (413, "request body too large"),
        (429, "too many concurrent requests"),
    )
}


class APIError(Exception):
    """An error answered to the client with ``status`` and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code


def error_response(error: APIError) -> JSONResponse:
    body = {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(body, status_code=error.status, headers=headers)


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    # loc is ("body", field, index, ...), with union-member labels mixed in
    # ("constrained-str", "list[int]"): the param is the field path without them.
    loc = [
        str(p)
        for p in first.get("loc", ())
        if isinstance(p, int) or (_IDENT.match(str(p)) and p not in _TYPE_LABELS)
    ]
    loc = loc[1:] if loc[:1] == ["body"] else loc
    param = ".".join(loc) or None
    if param is None and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return APIError(
            400,
            "the request body must be a JSON object (Content-Type: application/json)",
            code="invalid_json",
        )
    message = str(first.get("msg", "invalid request"))
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problems)"
    return APIError(400, message, param=param, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(_validation_error(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        error = APIError(exc.status_code, str(exc.detail), type=kind)
        response = error_response(error)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    async def spectune_error(request: Request, exc: Exception) -> JSONResponse:
        # Typed spectune errors are the request's fault (bad prompt, bad parameter).
        return error_response(APIError(400, str(exc), code=type(exc).__name__))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return error_response(APIError(500, "internal server error", type="server_error"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(SpectuneError, spectune_error)
    app.add_exception_handler(Exception, unexpected)
