"""Every failure of the REST API as `{"error": CODE, "message": TEXT}` with the status of the error class
(orchard/core/errors.py), including FastAPI's own validation and routing errors."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchard.core.errors import AuthError, InvalidRequest, NotFound, OrchardError
from orchard.sandbox.server.models import ErrorBody
from orchard.sandbox.server.validation import describe_validation_errors

log = logging.getLogger("orchard.sandbox.server")

# For the OpenAPI document: which errors a route may answer.
ERROR_RESPONSES = {
    status: {"model": ErrorBody, "description": description}
    for status, description in {
        400: "invalid request (`invalid_request`)",
        401: "missing or wrong API key (`unauthorized`)",
        404: "no such sandbox (`sandbox_not_found`)",
        410: "the sandbox was deleted or lost (`sandbox_lost`)",
        413: "request body too large (`too_large`)",
        503: "the backend failed (`backend_error`)",
    }.items()
}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorBody(error=code, message=message).model_dump(), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OrchardError)
    async def orchard_error(_: Request, exc: OrchardError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
        return error_response(exc.status, exc.code, str(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message = f"invalid request: {describe_validation_errors(exc.errors())}"
        return error_response(InvalidRequest.status, InvalidRequest.code, message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            code, message = NotFound.code, f"no route {request.method} {request.url.path}; see /docs"
        elif exc.status_code == 405:
            code, message = InvalidRequest.code, f"{request.method} is not allowed on {request.url.path}; see /docs"
        else:
            code, message = (InvalidRequest.code if exc.status_code < 500 else OrchardError.code), str(exc.detail)
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, OrchardError.code,
                              f"internal error ({type(exc).__name__}: {exc}); see the orchestrator's log")
