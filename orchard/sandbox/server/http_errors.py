"""Which errors the REST API's routes may answer, for the OpenAPI document. The handlers that answer every
failure as `{"error": CODE, "message": TEXT}` are `orchard.util.http_errors`'s, shared with the gateway."""

from __future__ import annotations

from orchard.core.errors import ErrorBody

ERROR_RESPONSES = {
    status: {"model": ErrorBody, "description": description}
    for status, description in {
        400: "invalid request (`invalid_request`)",
        401: "missing, wrong or expired API key (`unauthorized`)",
        403: "an owner key acting for another owner or on the server's settings (`forbidden`)",
        404: "no such sandbox (`sandbox_not_found`)",
        410: "the sandbox was deleted or lost (`sandbox_lost`)",
        409: "the idempotency key was used with another spec (`idempotency_conflict`)",
        413: "request body too large (`too_large`)",
        429: "at a cap on live sandboxes or on the create rate, after the bounded wait (`capacity_exceeded`)",
        503: "the backend failed (`backend_error`)",
    }.items()
}
