"""The gateway's HTTP API: OpenAI-compatible chat completions and model list, at `/v1/...` (rollout key in
the `X-Orchard-Rollout-Key` header) and at `/r/{rollout_key}/v1/...` (for harnesses that can only be given a
base URL), plus `/v1/rollouts/{key}` to set a rollout's budget and to end it and collect its records.

A request with `"stream": true` is answered as Server-Sent Events once the completion is done: the gateway
needs the whole response to record it, so the stream carries the finished content in one piece."""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, Header
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.core.errors import AuthError, InvalidRequest
from orchard.core.harness import ROLLOUT_KEY_HEADER
from orchard.gateway.budget import Budget
from orchard.gateway.gateway import Gateway, RolloutRecords, RolloutState
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
            gateway.close()

    app = FastAPI(title="Orchard model gateway", version="1", lifespan=lifespan)
    app.state.gateway = gateway
    install_error_handlers(app, service="gateway", log=log,
                           routes="the gateway serves /v1/chat/completions, /v1/models, /r/<rollout key>/v1/... "
                                  "and /v1/rollouts/<key>")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    openai_routes = APIRouter(dependencies=[Depends(_authenticate(gateway))])

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

    @openai_routes.post("/r/{rollout_key}/v1/chat/completions")
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
    openai_routes.add_api_route("/r/{rollout_key}/v1/models", models, methods=["GET"])

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
    return app


def _authenticate(gateway: Gateway):
    expected = gateway.config.api_key.get_secret_value().encode() if gateway.config.api_key else None

    async def check(authorization: str | None = Header(None)) -> None:
        if expected is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise AuthError("missing or wrong API key: send 'Authorization: Bearer <key>' with the gateway's key "
                            "(an OpenAI client's api_key)")

    return check
