"""A test double for a model provider: an OpenAI-compatible server that answers `/v1/chat/completions`
from a script of fixed responses, in order. Use it to debug a harness against known model output, to
replay a trajectory, or as a model with a fixed latency (`delay_s`) in benchmarks. Nothing in Orchard's
production code paths uses it.

    python -m orchard.testing.scripted_model --script replies.json --port 8001

Besides the OpenAI routes it serves `PUT /v1/script` (load another script and start over) and
`GET /v1/script/requests` (the request bodies received so far, to check what a harness sent). Like vLLM,
it returns `prompt_token_ids` and per-choice `token_ids` when a request sets `return_token_ids`, and
OpenAI-style `logprobs` when it sets `logprobs`. See `scripted_script.py` for the script format."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import typer
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.core.errors import InvalidRequest, OrchardError
from orchard.testing.scripted_script import (
    Script,
    ScriptedResponse,
    byte_token_text,
    byte_tokens,
    render_prompt,
)
from orchard.gateway.sse import DONE, completion_chunks, sse_event
from orchard.gateway.wire import ChatCompletionRequest
from orchard.util.http_errors import install_error_handlers

SCRIPT_EXHAUSTED = "script_exhausted"
MAX_KEPT_REQUESTS = 1000


class ScriptPlayer:
    """Hands out the script's responses in order, to concurrent requests too (thread-safe)."""

    def __init__(self, script: Script) -> None:
        self._lock = threading.Lock()
        self.load(script)

    def load(self, script: Script) -> None:
        with self._lock:
            self.script = script
            self._next = 0
            self.requests: list[dict[str, Any]] = []

    def take(self, request_body: dict[str, Any]) -> tuple[int, ScriptedResponse]:
        with self._lock:
            self.requests.append(request_body)
            del self.requests[:-MAX_KEPT_REQUESTS]
            count = len(self.script.responses)
            if self._next >= count and not self.script.loop:
                raise ScriptExhausted(f"the script's {count} responses have all been used; load another with "
                                      "PUT /v1/script, or set \"loop\": true to replay it")
            index = self._next % count
            self._next += 1
            return index, self.script.responses[index]


class ScriptExhausted(InvalidRequest):
    code = SCRIPT_EXHAUSTED


def completion_body(request: ChatCompletionRequest, index: int, response: ScriptedResponse) -> dict[str, Any]:
    """The `chat.completion` body for one scripted response, with vLLM/OpenAI token fields if asked."""
    extra = request.model_extra or {}
    tool_calls = [{"id": call.id or f"call_{index}_{position}", "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments_json()}}
                  for position, call in enumerate(response.tool_calls)]
    message: dict[str, Any] = {"role": "assistant", "content": response.content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if response.reasoning_content is not None:
        message["reasoning_content"] = response.reasoning_content
    prompt_ids = byte_tokens(render_prompt(request.messages, request.tools))
    completion_ids = response.token_ids()
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                              "finish_reason": response.finish_reason or ("tool_calls" if tool_calls else "stop")}
    if extra.get("logprobs"):
        choice["logprobs"] = {"content": [
            {"token": byte_token_text(token), "logprob": logprob, "bytes": [token] if token < 256 else None,
             "top_logprobs": []}
            for token, logprob in zip(completion_ids, response.token_logprobs())]}
    body: dict[str, Any] = {
        "id": f"chatcmpl-scripted-{index}-{time.monotonic_ns()}", "object": "chat.completion",
        "created": int(time.time()), "model": request.model, "choices": [choice],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                  "total_tokens": len(prompt_ids) + len(completion_ids)}}
    if extra.get("return_token_ids"):
        body["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = completion_ids
    return body


def create_scripted_app(script: Script, *, model_name: str = "scripted") -> FastAPI:
    player = ScriptPlayer(script)
    app = FastAPI(title="Orchard scripted model server", version="1")
    app.state.player = player

    install_error_handlers(app, service="scripted model server")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "orchard-scripted"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest) -> Response:
        index, response = player.take(request.model_dump(exclude_none=True))
        delay = response.delay_s if response.delay_s is not None else player.script.delay_s
        if delay:
            await asyncio.sleep(delay)
        body = completion_body(request, index, response)
        if not request.stream:
            return JSONResponse(body)
        chunks = completion_chunks(body, include_usage=request.wants_stream_usage, content_pieces=4)
        stream = b"".join(sse_event(chunk) for chunk in chunks) + DONE
        return StreamingResponse(iter([stream]), media_type="text/event-stream")

    @app.put("/v1/script")
    async def load_script(request: Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError:
            raise InvalidRequest("the body must be a JSON script (a list of responses)") from None
        player.load(Script.parse(data, where="the request body"))
        return {"responses": len(player.script.responses), "loop": player.script.loop}

    @app.get("/v1/script/requests")
    async def received_requests() -> list[dict[str, Any]]:
        return list(player.requests)

    return app


def serve_scripted(script: Script | str | Path, host: str = "127.0.0.1", port: int = 8001, *,
                   model_name: str = "scripted", log_level: str = "warning") -> None:
    """Serve `script` (a Script or a JSON file) until SIGINT/SIGTERM."""
    import uvicorn

    if not isinstance(script, Script):
        script = Script.load(script)
    uvicorn.run(create_scripted_app(script, model_name=model_name), host=host, port=port, access_log=False,
                log_level=log_level)


cli = typer.Typer(add_completion=False, help="Serve a scripted OpenAI-compatible model.")


@cli.command()
def main(script: Path = typer.Option(..., "--script", help="JSON file: a list of responses"),
         port: int = typer.Option(8001, help="port to listen on"),
         host: str = typer.Option("127.0.0.1", help="address to listen on"),
         delay_s: float | None = typer.Option(None, help="wait before each answer (overrides the script's)"),
         loop: bool | None = typer.Option(None, "--loop/--no-loop", help="replay the script when it ends"),
         model_name: str = typer.Option("scripted", help="the model id /v1/models lists")) -> None:
    updates = {key: value for key, value in (("delay_s", delay_s), ("loop", loop)) if value is not None}
    try:
        loaded = Script.load(script)
        loaded = Script.parse({**loaded.model_dump(), **updates}, where=f"{script} with the options given")
    except OrchardError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    serve_scripted(loaded, host, port, model_name=model_name)


if __name__ == "__main__":
    cli()
