"""The gateway's HTTP API: OpenAI-compatible chat completions and model list, at `/v1/...` (rollout key in
the `X-Orchard-Rollout-Key` header) and at `/r/{rollout_key}/v1/...` (for harnesses that can only be given a
base URL), plus `/v1/rollouts/{key}` to set a rollout's budget and to end it and collect its records. The
`/r/{rollout_key}/v1/...` routes also take that rollout's own API key (rollout_keys.py), the credential a
sandbox gets; everything else takes only the gateway's key.

A request with `"stream": true` is answered as Server-Sent Events once the completion is done: the gateway
needs the whole response to record it, so the stream carries the finished content in one piece."""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.core.errors import AuthError, InvalidRequest
from orchard.core.harness import ROLLOUT_KEY_HEADER
from orchard.gateway.budget import Budget
from orchard.gateway.gateway import Gateway, RolloutRecords, RolloutState
from orchard.gateway.rollout_keys import is_rollout_api_key
from orchard.gateway.sse import DONE, completion_chunks, sse_event
from orchard.gateway.wire import ChatCompletionRequest
from orchard.util.http_errors import install_error_handlers

log = logging.getLogger("orchard.gateway")


def create_app(gateway: Gateway) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        gateway.warm_up()
        try:
            yield
        finally:
            await gateway.aclose()

    app = FastAPI(title="Orchard model gateway", version="1", lifespan=lifespan)
    app.state.gateway = gateway
    install_error_handlers(app, service="gateway", log=log,
                           routes="the gateway serves /v1/chat/completions, /v1/models, /r/<rollout key>/v1/... "
                                  "and /v1/rollouts/<key>")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    openai_routes = APIRouter(dependencies=[Depends(_authenticate(gateway))])
    rollout_routes = APIRouter(dependencies=[Depends(_authenticate(gateway, rollout_scoped=True))])

    async def chat_completions(request: ChatCompletionRequest, rollout_key: str | None) -> Response:
        body = await gateway.complete(rollout_key, request)
        if not request.stream:
            return JSONResponse(body)
        chunks = completion_chunks(body, include_usage=request.wants_stream_usage)
        return StreamingResponse(iter([b"".join(sse_event(chunk) for chunk in chunks) + DONE]),
                                 media_type="text/event-stream")

    @openai_routes.post("/v1/chat/completions")
    async def keyed_by_header(request: ChatCompletionRequest,
                              key: str | None = Header(None, alias=ROLLOUT_KEY_HEADER)) -> Response:
        return await chat_completions(request, key)

    @rollout_routes.post("/r/{rollout_key}/v1/chat/completions")
    async def keyed_by_path(rollout_key: str, request: ChatCompletionRequest,
                            key: str | None = Header(None, alias=ROLLOUT_KEY_HEADER)) -> Response:
        if key is not None and key != rollout_key:
            raise InvalidRequest(f"the path says rollout {rollout_key!r} but the {ROLLOUT_KEY_HEADER} header says "
                                 f"{key!r}; send one or make them agree")
        return await chat_completions(request, rollout_key)

    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": alias, "object": "model", "created": 0, "owned_by": "orchard"}
                                           for alias in gateway.models()]}

    openai_routes.add_api_route("/v1/models", models, methods=["GET"])
    rollout_routes.add_api_route("/r/{rollout_key}/v1/models", models, methods=["GET"])

    @openai_routes.post("/v1/rollouts/{rollout_key}", response_model=RolloutState)
    async def start_rollout(rollout_key: str, budget: Budget | None = Body(None)) -> RolloutState:
        return gateway.start_rollout(rollout_key, budget)

    @openai_routes.get("/v1/rollouts/{rollout_key}", response_model=RolloutRecords)
    async def rollout_records(rollout_key: str) -> RolloutRecords:
        state = gateway.rollout_state(rollout_key)
        return RolloutRecords(**state.model_dump(), calls=gateway.calls(rollout_key))

    @openai_routes.delete("/v1/rollouts/{rollout_key}", response_model=RolloutRecords)
    async def end_rollout(rollout_key: str) -> RolloutRecords:
        return gateway.end_rollout(rollout_key)

    app.include_router(openai_routes)
    app.include_router(rollout_routes)
    return app


def _authenticate(gateway: Gateway, *, rollout_scoped: bool = False):
    """The gateway's key; with `rollout_scoped` (routes under /r/{rollout_key}/), that rollout's key too."""
    secret = gateway.config.api_key.get_secret_value() if gateway.config.api_key else None
    expected = secret.encode() if secret is not None else None

    async def check(request: Request, authorization: str | None = Header(None)) -> None:
        if secret is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        given = given.strip()
        if scheme.lower() == "bearer":
            if hmac.compare_digest(given.encode(), expected):
                return
            rollout_key = request.path_params.get("rollout_key")
            if rollout_scoped and rollout_key and is_rollout_api_key(given, secret, rollout_key):
                return
        raise AuthError("missing or wrong API key: send 'Authorization: Bearer <key>' with the gateway's key, or "
                        "on /r/<rollout key>/v1 that rollout's own key (an OpenAI client's api_key); a rollout's "
                        "key is good for its own rollout only")

    return check
