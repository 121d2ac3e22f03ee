"""Every failure of one of Orchard's HTTP services (orchestrator, gateway, test servers) answered as
`{"error": CODE, "message": TEXT}` (`orchard.core.errors.ErrorBody`) with the status of the error class,
including FastAPI's own validation and routing errors and unexpected exceptions."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchard.core.errors import AuthError, ErrorBody, InvalidRequest, NotFound, OrchardError, describe_validation_errors

# A request that gets many fields wrong is told about the first few (it fixes those first).
VALIDATION_ERRORS_SHOWN = 10


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorBody(error=code, message=message).model_dump(), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI, *, service: str, routes: str | None = None,
                           log: logging.Logger | None = None) -> None:
    """Answer every error of `app` as an ErrorBody. `service` names it in messages ("the {service}'s log");
    `routes` is what a request for an unknown route is told (default: see /docs, when the app has docs);
    unexpected exceptions are logged to `log` (default `orchard.<service>`)."""
    log = log or logging.getLogger(f"orchard.{service}")
    docs = "see /docs" if app.docs_url else ""
    routes = routes or docs

    @app.exception_handler(OrchardError)
    async def orchard_error(_: Request, exc: OrchardError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            headers = {"Retry-After": str(max(1, math.ceil(retry_after)))}
        return error_response(exc.status, exc.code, str(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = describe_validation_errors(exc, "request", limit=VALIDATION_ERRORS_SHOWN)
        return error_response(InvalidRequest.status, InvalidRequest.code, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            code, message = NotFound.code, f"no route {where}" + (f"; {routes}" if routes else "")
        elif exc.status_code == 405:
            code = InvalidRequest.code
            message = f"{request.method} is not allowed on {request.url.path}" + (f"; {docs}" if docs else "")
        else:
            code, message = (InvalidRequest.code if exc.status_code < 500 else OrchardError.code), str(exc.detail)
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, OrchardError.code, f"internal {service} error ({type(exc).__name__}: {exc}); "
                              f"see the {service}'s log")
