"""The policy served by a vLLM server, **token in, token out**: the RL rollout path's prompts go to vLLM's
completions endpoint as token ids, never as chat text.

`VLLMPolicy` is `TrainingPolicy` (orchard.recipes.rl.policy) with its sampler swapped: a rollout's prompt
ids are built here exactly as for in-process generation (the first call rendered with the tokenizer's chat
template; every later call = the previous prompt + the ids vLLM sampled + the ids of what the harness added),
then sent as `POST {url}/completions` with `prompt` a list of ids, `logprobs: 0` (the sampled token's
logprob) and `return_token_ids`. vLLM continues from exactly those ids, so the ids and logprobs the gateway
records — and the trainer gets — are the ones vLLM sampled; nothing is re-tokenized. The gateway still
records each call (it serves this object as a live policy, like the in-process one).

The tokenizer here must be the served model's (load it from the same directory). vLLM's reply is checked:
if the prompt ids it echoes differ from those sent (a server that added a BOS, say), the call fails
instead of training on ids the model never saw.

Calls of different rollouts reach the server at once (only the prompt bookkeeping is locked), so parallel
rollouts (`--parallel`) share one server's batch.

Weights: `weights_changed()` (the rollout function calls it before each step's rollouts) hands the
trainer's current model to `sync` if one is set (orchard.recipes.rl.vllm_sync); without it the server keeps
the weights it started with and the run is off-policy after the first step.

A dictated completion (`forced`: `--guide oracle`'s replies) is scored by the server too: the prompt and the
dictated ids go to `/completions` with `prompt_logprobs: 0`, so its logprobs are the served weights' — the
trainer's, once synced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import httpx

from orchard.core.errors import InvalidRequest, ModelError
from orchard.recipes.rl.policy import TrainingPolicy

DEFAULT_TIMEOUT_S = 600.0


@dataclass
class VLLMPolicy(TrainingPolicy):
    """`VLLMPolicy(tokenizer=..., url="http://127.0.0.1:8000/v1", served_model="NAME")`; `model` is the
    trainer's model when one is training (set by the rollout function), unused for generation."""

    model: Any = None
    tokenizer: Any = None
    url: str = ""
    served_model: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    sync: Callable[[Any], None] | None = None
    samples_in_parallel = True  # `_sample` is an HTTP call: no lock around it

    def __post_init__(self) -> None:
        if self.tokenizer is None or not self.url or not self.served_model:
            raise InvalidRequest("VLLMPolicy needs the served model's tokenizer, the server's url "
                                 "(e.g. http://127.0.0.1:8000/v1) and the served model's name")
        super().__post_init__()
        self._client = httpx.Client(base_url=self.url.rstrip("/"), timeout=self.timeout_s)

    def close(self) -> None:
        self._client.close()
        if self.sync is not None and hasattr(self.sync, "close"):
            self.sync.close()

    def weights_changed(self) -> None:
        super().weights_changed()
        if self.sync is not None and self.model is not None:
            self.sync(self.model)

    def completion_request(self, prompt: list[int], temperature: float | None, top_p: float | None,
                           max_new_tokens: int, seed: int | None) -> dict[str, Any]:
        """The body sent to `/completions`: the prompt as ids, the sampled ids and logprobs asked back."""
        body: dict[str, Any] = {
            "model": self.served_model, "prompt": prompt, "max_tokens": max_new_tokens,
            "temperature": float(temperature) if temperature else 0.0, "logprobs": 0,
            "return_token_ids": True, "stop_token_ids": [self.end_of_turn_id], "skip_special_tokens": False,
        }
        if temperature and top_p is not None:
            body["top_p"] = top_p
        if seed is not None:
            body["seed"] = seed
        return body

    def _sample(self, prompt: list[int], temperature: float | None, top_p: float | None, max_new_tokens: int,
                seed: int | None) -> tuple[list[int], list[float]]:
        body = self.completion_request(prompt, temperature, top_p, max_new_tokens, seed)
        return parse_completion(self._post(body), prompt)

    def _score(self, prompt: list[int], ids: list[int]) -> list[float]:
        """The served model's logprobs of dictated ids (forced / --guide) after `prompt`: vLLM reads
        prompt + ids and returns each prompt token's logprob (`prompt_logprobs: 0`); one token is sampled
        and dropped (vLLM samples at least one)."""
        sequence = prompt + ids
        body = {"model": self.served_model, "prompt": sequence, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0, "return_token_ids": True}
        return parse_prompt_logprobs(self._post(body), sequence, len(ids))

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._client.post("/completions", json=body)
        except httpx.HTTPError as exc:
            raise ModelError(f"the vLLM server at {self.url} did not answer: {type(exc).__name__}: {exc}; "
                             f"is it running and serving {self.served_model!r}?") from exc
        if response.status_code != 200:
            raise ModelError(f"the vLLM server at {self.url} answered {response.status_code}: "
                             f"{response.text[:500]}")
        return response.json()


def parse_prompt_logprobs(body: dict[str, Any], sequence: list[int], count: int) -> list[float]:
    """The logprobs of the last `count` ids of `sequence` from vLLM's `prompt_logprobs` (one entry per prompt
    token, None for the first, each a map from token id to its logprob)."""
    try:
        choice = body["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"the vLLM reply has no choice: {str(body)[:300]}") from exc
    _check_echo(choice.get("prompt_token_ids") or body.get("prompt_token_ids"), sequence)
    entries = choice.get("prompt_logprobs") or body.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(sequence):
        raise ModelError(f"the vLLM reply has {len(entries) if isinstance(entries, list) else 'no'} prompt "
                         f"logprobs for {len(sequence)} prompt ids; ask with `prompt_logprobs: 0`")
    logprobs = []
    for position in range(len(sequence) - count, len(sequence)):
        entry = (entries[position] or {}).get(str(sequence[position]))
        if position == 0 or entry is None:
            raise ModelError(f"the vLLM reply gives no logprob for prompt token {position} "
                             f"(id {sequence[position]})")
        logprobs.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
    return logprobs


def _check_echo(echoed: Any, prompt: list[int]) -> None:
    if echoed is not None and list(echoed) != list(prompt):
        position = next((i for i, (a, b) in enumerate(zip(echoed, prompt)) if a != b), min(len(echoed), len(prompt)))
        raise ModelError(f"vLLM read other prompt ids than those sent (they differ at token {position}); "
                         "the trainer would train on ids the model never saw")


def parse_completion(body: dict[str, Any], prompt: list[int]) -> tuple[list[int], list[float]]:
    """(sampled ids, their logprobs) from vLLM's `text_completion` body, checked against the prompt sent."""
    try:
        choice = body["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"the vLLM reply has no choice: {str(body)[:300]}") from exc
    ids = choice.get("token_ids")
    if ids is None:
        raise ModelError("the vLLM reply has no token_ids: the server ignored `return_token_ids` "
                         "(vLLM 0.10.2 or later returns them)")
    _check_echo(choice.get("prompt_token_ids") or body.get("prompt_token_ids"), prompt)
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if logprobs is None or len(logprobs) != len(ids):
        raise ModelError(f"the vLLM reply has {0 if logprobs is None else len(logprobs)} logprobs for "
                         f"{len(ids)} sampled ids; ask with `logprobs: 0`")
    return [int(t) for t in ids], [float(lp) for lp in logprobs]
