"""The gateway itself, usable in-process: `await gateway.complete(rollout_key, request)` makes a model
call (through litellm, or its fast path for self-hosted OpenAI-compatible servers: direct.py), records it
under the rollout key and enforces that rollout's budget. The HTTP app (app.py) is a thin layer over this
object."""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from orchard.core.errors import InvalidRequest, first_problem, NotFound, OrchardError
from orchard.core.harness import ROLLOUT_KEY_HEADER
from orchard.core.trajectory import LLMCall
from orchard.gateway.budget import Budget, BudgetLedger, RolloutUsage
from orchard.gateway.call_record import failure_record, new_call_id, success_record, total_tokens, utc_now_iso
from orchard.gateway.config import GatewayConfig
from orchard.gateway.direct import ClientPool
from orchard.gateway.litellm_loader import load_litellm
from orchard.gateway.provider import call_provider, effective_params
from orchard.gateway.recorder import Recorder
from orchard.gateway.wire import ChatCompletionRequest
from orchard.policies.registry import model_names

UNKEYED_ROLLOUT = "unkeyed"
_ROLLOUT_KEY = re.compile(r"[^\s/]{1,256}")


class RolloutState(BaseModel):
    rollout_key: str
    budget: Budget
    usage: RolloutUsage = Field(default_factory=RolloutUsage)


class RolloutRecords(RolloutState):
    calls: list[LLMCall] = Field(default_factory=list)


class Gateway:
    def __init__(self, config: GatewayConfig | None = None, *, recorder: Recorder | None = None) -> None:
        self.config = config or GatewayConfig()
        self.recorder = recorder or Recorder(self.config.record_path)
        self.budgets = BudgetLedger(self.config.default_budget)
        self._direct = ClientPool()

    def warm_up(self) -> None:
        """Import litellm now (seconds) rather than during the first call."""
        load_litellm()

    async def complete(self, rollout_key: str | None,
                       request: ChatCompletionRequest | dict[str, Any]) -> dict[str, Any]:
        """Make one chat completion for `rollout_key` and record it; return the response body (a dict in
        OpenAI's `chat.completion` format). Raises InvalidRequest (bad request, unknown model),
        BudgetExceeded, ModelUnreachable / ModelRateLimited / ModelError (the provider failed)."""
        request = _parse_request(request)
        key = self.rollout_key(rollout_key)
        route = self.config.route(request.model)
        params = effective_params(route, request)
        self.budgets.admit(key)
        call_id, started_at, start = new_call_id(), utc_now_iso(), time.perf_counter()
        try:
            answer = await call_provider(route, request, params, timeout_s=self.config.timeout_s,
                                         num_retries=self.config.num_retries, rollout_key=key,
                                         direct=self._direct if self.config.fast_path else None)
        except OrchardError as exc:
            self.recorder.add(failure_record(
                call_id=call_id, rollout_key=key, request=request, params=params, provider_model=route.model,
                error=f"{exc.code}: {exc}", latency_s=time.perf_counter() - start, started_at=started_at))
            raise
        latency = time.perf_counter() - start
        call = success_record(call_id=call_id, rollout_key=key, request=request, params=params,
                              provider_model=route.model, response=answer.response, cost_usd=answer.cost_usd,
                              latency_s=latency, started_at=started_at)
        self.budgets.charge(key, total_tokens(call))
        self.recorder.add(call)
        return answer.response

    def rollout_key(self, given: str | None) -> str:
        if given is None or given == "":
            if self.config.require_rollout_key:
                raise InvalidRequest(f"this gateway needs a rollout key: send the {ROLLOUT_KEY_HEADER} header, "
                                     "or use the base URL /r/<rollout key>/v1")
            return UNKEYED_ROLLOUT
        if not _ROLLOUT_KEY.fullmatch(given):
            raise InvalidRequest(f"invalid rollout key {given[:60]!r}: use 1 to 256 characters without spaces "
                                 "or '/'")
        return given

    def models(self) -> list[str]:
        return sorted(set(self.config.models) | set(model_names()))

    def start_rollout(self, rollout_key: str, budget: Budget | None = None) -> RolloutState:
        """Start a rollout with its own budget (default: the config's), or change a running one's budget."""
        key = self.rollout_key(rollout_key)
        self.budgets.set_budget(key, budget)
        return self.rollout_state(key)

    def rollout_state(self, rollout_key: str) -> RolloutState:
        key = self.rollout_key(rollout_key)
        usage = self.budgets.usage(key)
        if usage is None:
            raise NotFound(f"no rollout {key!r} at this gateway: it was never started and made no calls, or it "
                           "was already ended")
        return RolloutState(rollout_key=key, budget=self.budgets.budget(key), usage=usage)

    def calls(self, rollout_key: str) -> list[LLMCall]:
        """The calls recorded for a rollout so far (it keeps running)."""
        return self.recorder.calls(self.rollout_key(rollout_key))

    def end_rollout(self, rollout_key: str) -> RolloutRecords:
        """Forget a rollout and return its budget, usage and every call it made."""
        state = self.rollout_state(rollout_key)
        self.budgets.forget(state.rollout_key)
        return RolloutRecords(**state.model_dump(), calls=self.recorder.pop(state.rollout_key))

    async def aclose(self) -> None:
        """`close`, and also the fast path's connections opened on the running event loop."""
        await self._direct.aclose()
        self.recorder.close()

    def close(self) -> None:
        self._direct.close()
        self.recorder.close()


def _parse_request(request: ChatCompletionRequest | dict[str, Any]) -> ChatCompletionRequest:
    if isinstance(request, ChatCompletionRequest):
        return request
    try:
        return ChatCompletionRequest.model_validate(request)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid chat completion request: {first_problem(exc.errors(), 'request')}") from None

