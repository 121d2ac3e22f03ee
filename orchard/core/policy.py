"""The Policy protocol: a model that runs inside Orchard's own process (the oracle, the embedded SmolLM2, a
third party's) and that the gateway serves by name like any provider's model. Contracts only, no I/O.

Every such model, built in or third-party, is registered as a Python entry point in the group
`orchard.models` (`name = "package.module:PolicyClass"`); orchard/policies/registry.py lists and loads
them, so the gateway, the evaluator and the CLI find them in one place and none is imported by name. The
gateway reaches a policy `NAME` as the litellm model `orchard/NAME` (provider `orchard`).

A policy may also define the rollout hooks of `RolloutHooks`: the evaluator calls them, in the gateway's
process, around every rollout served by that policy (the oracle learns there which task a rollout plays)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from orchard.core.task import Task

ENTRY_POINT_GROUP = "orchard.models"
PROVIDER = "orchard"
PROVIDER_PREFIX = f"{PROVIDER}/"


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    text: str
    logprob: float
    top: list[tuple[str, float]]  # (text, logprob) of the most likely tokens, best first


@dataclass(frozen=True)
class Completion:
    """One answer of a policy: an OpenAI assistant message and its finish reason, with the token ids and
    logprobs when the policy has them (the gateway records them as they are; without, usage is zero)."""

    message: dict[str, Any]  # {"role": "assistant", "content": ..., "tool_calls": [...]}
    finish_reason: str  # "stop", "tool_calls" or "length"
    model: str | None = None  # the response's `model`; None: the policy's name
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[TokenLogprob] | None = None  # one per completion token


@runtime_checkable
class Policy(Protocol):
    """A model served by the gateway as `orchard/<name>`.

    `complete` gets the request's messages, its OpenAI `tools` (or None) and all its parameters
    (temperature, max_tokens, tool_choice, ...; a policy honours those it can), the call's rollout key and
    the seconds it may take. It raises Orchard's typed errors (InvalidRequest: the gateway answers 400,
    ModelError: 502). `blocking` says whether it takes real time (generation): the gateway then runs it in a
    worker thread; a policy that answers at once (`blocking = False`) runs on the gateway's event loop."""

    name: str
    description: str
    blocking: bool

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 params: dict[str, Any], *, rollout_key: str | None, timeout_s: float | None) -> Completion: ...


@runtime_checkable
class RolloutHooks(Protocol):
    """Optional: told which task each rollout plays. The evaluator calls `prepare_rollout` before the harness
    runs (an error there ends the trial as a `model_error`) and `end_rollout` after it, whatever happened.
    Both must be quick and must not block (they run on the evaluator's event loop)."""

    def prepare_rollout(self, rollout_key: str, task: Task) -> None: ...

    def end_rollout(self, rollout_key: str) -> None: ...
