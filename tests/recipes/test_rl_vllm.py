"""The vLLM rollout path, token in, token out (orchard.recipes.rl.vllm).

- Against a stand-in server (fast, always run): a real local HTTP server that answers vLLM's
  `/v1/completions` with scripted ids — a FAKE of vLLM (it samples nothing), there only to check the request
  shape (the prompt sent as ids, logprobs and token ids asked back) and that a rollout's second prompt is the
  first prompt + the ids the server returned + the harness's new message, with nothing re-tokenized.
- Against a real vLLM server (gated: set ORCHARD_VLLM_URL, ORCHARD_VLLM_MODEL — the served name — and
  ORCHARD_VLLM_TOKENIZER, the model directory it serves; docs/training.md says how to start one on a CPU):
  a multi-turn react rollout on a swe-mini task through the run's gateway, with zero drift between the ids and
  logprobs vLLM returned and the GRPO sample the trainer receives."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchard.core.errors import ModelError
from orchard.recipes.rl.vllm import VLLMPolicy, parse_completion, parse_prompt_logprobs

pytestmark = pytest.mark.model  # transformers (the tokenizer)

REPLIES = ['<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', "Done."]
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


@pytest.fixture(scope="module")
def tokenizer():
    from orchard.recipes.common.tiny_models import smollm2_tokenizer

    return smollm2_tokenizer()


def _send_json(handler: BaseHTTPRequestHandler, payload: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


@contextlib.contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]):
    """A stand-in server on a free port, on a thread; its /v1 base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def stand_in(tokenizer):
    """A real HTTP server speaking vLLM's completions reply (scripted ids; see the module docstring)."""
    received: list[dict[str, Any]] = []
    replies: list[list[int]] = []
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            ids = list(tokenizer(REPLIES[min(len(replies), len(REPLIES) - 1)], add_special_tokens=False)["input_ids"])
            ids.append(eot)
            replies.append(ids)
            payload = json.dumps({"object": "text_completion", "model": body["model"], "choices": [{
                "index": 0, "text": "", "finish_reason": "stop", "token_ids": ids,
                "prompt_token_ids": body["prompt"],
                "logprobs": {"tokens": [], "token_logprobs": [-0.25] * len(ids)}}]}).encode()
            _send_json(self, payload)

        def log_message(self, *args: Any) -> None:
            pass

    with _serving(Handler) as url:
        yield url, received, replies


def test_prompts_go_as_ids_and_the_next_prompt_extends_the_sampled_ids(tokenizer, stand_in):
    url, received, replies = stand_in
    policy = VLLMPolicy(tokenizer=tokenizer, url=url, served_model="served")
    try:
        messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix it."}]
        params = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 32, "seed": 3}
        first = policy.complete(messages, TOOLS, params, rollout_key="r1", timeout_s=None)
        assert first.message["tool_calls"][0]["function"]["name"] == "bash"
        messages += [first.message, {"role": "tool", "tool_call_id": first.message["tool_calls"][0]["id"],
                                     "content": "README.md\nsrc"}]
        second = policy.complete(messages, TOOLS, params, rollout_key="r1", timeout_s=None)
    finally:
        policy.close()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert received[0] == {"model": "served", "prompt": first.prompt_token_ids, "max_tokens": 32,
                           "temperature": 0.7, "top_p": 0.9, "seed": 3, "logprobs": 0, "return_token_ids": True,
                           "stop_token_ids": [eot], "skip_special_tokens": False}
    assert all(isinstance(t, int) for t in received[0]["prompt"])
    assert (first.completion_token_ids, second.completion_token_ids) == (replies[0], replies[1])
    assert [e.logprob for e in first.logprobs] == [-0.25] * len(replies[0])
    sent = received[1]["prompt"]  # token in: the first prompt and the sampled ids, unchanged, then the tool's
    assert sent == second.prompt_token_ids
    assert sent[:len(received[0]["prompt"]) + len(replies[0])] == received[0]["prompt"] + replies[0]
    assert "README.md" in tokenizer.decode(sent[len(received[0]["prompt"]) + len(replies[0]):])
    assert second.message["content"] == "Done." and second.finish_reason == "stop"


def test_a_reply_that_read_other_prompt_ids_or_lacks_ids_is_refused():
    reply = {"choices": [{"token_ids": [5, 6], "prompt_token_ids": [1, 9, 3],
                          "logprobs": {"token_logprobs": [-1.0, -2.0]}}]}
    with pytest.raises(ModelError, match="differ at token 1"):
        parse_completion(reply, [1, 2, 3])
    assert parse_completion(reply, [1, 9, 3]) == ([5, 6], [-1.0, -2.0])
    with pytest.raises(ModelError, match="return_token_ids"):
        parse_completion({"choices": [{"text": "hi"}]}, [1])
    with pytest.raises(ModelError, match="logprobs"):
        parse_completion({"choices": [{"token_ids": [5], "logprobs": None}]}, [1])


def test_dictated_ids_are_scored_from_the_servers_prompt_logprobs():
    """vLLM's `prompt_logprobs` (as vLLM 0.32 writes them: None for the first token, then a map from the
    token id, as text, to its logprob, rank and text): the last ids' logprobs are read, checked to be
    those of the ids sent."""
    def entry(token: int, logprob: float) -> dict:
        return {str(token): {"logprob": logprob, "rank": 3, "decoded_token": "x"}}

    body = {"choices": [{"prompt_token_ids": [1, 2, 3, 4], "token_ids": [9],
                         "prompt_logprobs": [None, entry(2, -1.5), entry(3, -0.5), entry(4, -2.0)]}]}
    assert parse_prompt_logprobs(body, [1, 2, 3, 4], 2) == [-0.5, -2.0]
    with pytest.raises(ModelError, match="differ at token 2"):
        parse_prompt_logprobs(body, [1, 2, 7, 4], 2)
    with pytest.raises(ModelError, match="no logprob for prompt token 0"):
        parse_prompt_logprobs(body, [1, 2, 3, 4], 4)
    with pytest.raises(ModelError, match="prompt_logprobs: 0"):
        parse_prompt_logprobs({"choices": [{"token_ids": [9]}]}, [1, 2], 1)


REAL = {name: os.environ.get(name) for name in ("ORCHARD_VLLM_URL", "ORCHARD_VLLM_MODEL", "ORCHARD_VLLM_TOKENIZER")}


@pytest.mark.slow
@pytest.mark.skipif(not all(REAL.values()), reason="needs a vLLM server: set ORCHARD_VLLM_URL, ORCHARD_VLLM_MODEL "
                                                  "and ORCHARD_VLLM_TOKENIZER (docs/training.md)")
def test_a_multi_turn_rollout_on_real_vllm_has_zero_token_drift():
    import transformers

    from orchard.core.harness import SamplingParams
    from orchard.eval.suites import load_suite
    from orchard.recipes.rl.env import RolloutEnv
    from orchard.recipes.rl.samples import rollout_sample

    tokenizer = transformers.AutoTokenizer.from_pretrained(REAL["ORCHARD_VLLM_TOKENIZER"], local_files_only=True)
    policy = VLLMPolicy(tokenizer=tokenizer, url=REAL["ORCHARD_VLLM_URL"], served_model=REAL["ORCHARD_VLLM_MODEL"])
    answers: list[dict[str, Any]] = []  # what vLLM itself returned, call by call

    def keep(response: Any) -> None:
        response.read()
        answers.append(response.json()["choices"][0])

    policy._client.event_hooks["response"] = [keep]
    task = load_suite("swe-mini").get("orchard__pagekit-112")
    try:
        with RolloutEnv(policy, harness_options={"step_limit": 3},
                        sampling=SamplingParams(temperature=1.0, max_tokens=24, seed=7)) as env:
            trajectory = env.rollout(task)
    finally:
        policy.close()
    calls = trajectory.llm_calls
    assert len(calls) >= 2 and len(calls) == len(answers), (trajectory.exit_status, len(calls), len(answers))
    for call, answer in zip(calls, answers):  # the gateway recorded exactly what vLLM read and sampled
        assert call.prompt_token_ids == answer["prompt_token_ids"]
        assert call.completion_token_ids == answer["token_ids"]
        assert call.logprobs == pytest.approx(answer["logprobs"]["token_logprobs"])
    for previous, call in zip(calls, calls[1:]):  # token in: each prompt extends the last prompt + sample
        sequence = previous.prompt_token_ids + previous.completion_token_ids
        assert call.prompt_token_ids[:len(sequence)] == sequence
    sample = rollout_sample(trajectory, tokenizer.pad_token_id or 0)
    assert sample.drift is None and sample.calls == len(calls)
    assert [t for t, m in zip(sample.completion_ids, sample.env_mask) if m] == \
        [t for answer in answers for t in answer["token_ids"]]
    assert [lp for lp, m in zip(sample.logprobs, sample.env_mask) if m] == pytest.approx(
        [lp for answer in answers for lp in answer["logprobs"]["token_logprobs"]])


@pytest.mark.slow
@pytest.mark.skipif(not all(REAL.values()), reason="needs a vLLM server started with VLLM_SERVER_DEV_MODE=1: "
                                                  "set ORCHARD_VLLM_URL, ORCHARD_VLLM_MODEL and "
                                                  "ORCHARD_VLLM_TOKENIZER (docs/training.md)")
def test_the_server_samples_from_the_trainers_weights_after_a_reload(tmp_path):
    """The served model's weights changed on disk and reloaded: the same prompt scores differently; the
    original weights reloaded: it scores as before."""
    import torch
    import transformers

    from orchard.recipes.rl.vllm_sync import ReloadWeights

    directory = REAL["ORCHARD_VLLM_TOKENIZER"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype="float32")
    policy = VLLMPolicy(tokenizer=tokenizer, url=REAL["ORCHARD_VLLM_URL"], served_model=REAL["ORCHARD_VLLM_MODEL"])
    sync = ReloadWeights(REAL["ORCHARD_VLLM_URL"], tmp_path / "sync")
    prompt = list(tokenizer("The capital of France is", add_special_tokens=False)["input_ids"])
    try:
        before = policy._sample(prompt, None, None, 4, None)
        with torch.no_grad():
            model.model.norm.weight.mul_(0.5)
        sync(model)
        changed = policy._sample(prompt, None, None, 4, None)
        with torch.no_grad():
            model.model.norm.weight.mul_(2.0)
        sync(model)
        restored = policy._sample(prompt, None, None, 4, None)
    finally:
        policy.close()
    assert changed[1] != pytest.approx(before[1], abs=1e-3)
    assert restored[0] == before[0] and restored[1] == pytest.approx(before[1], abs=1e-4)
    assert sync.syncs == 2 and [p.name for p in (tmp_path / "sync").iterdir()] == ["step-2"]
    sync.close()
    assert not (tmp_path / "sync").exists()


def test_calls_of_different_rollouts_reach_the_server_at_once(tokenizer):
    """The stand-in (a fake of vLLM, see the module docstring) answers only once two requests are in flight
    together: with the calls serialized the first would wait alone and fail."""
    arrived = threading.Barrier(2, timeout=30)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            arrived.wait()
            payload = json.dumps({"choices": [{"token_ids": [eot], "prompt_token_ids": body["prompt"],
                                               "logprobs": {"token_logprobs": [-0.1]}}]}).encode()
            _send_json(self, payload)

        def log_message(self, *args: Any) -> None:
            pass

    results: dict[str, Any] = {}

    def rollout(key: str) -> None:
        try:
            results[key] = policy.complete([{"role": "user", "content": key}], None, {"max_tokens": 4},
                                           rollout_key=key, timeout_s=None)
        except Exception as exc:  # reported by the assertion below
            results[key] = exc

    with _serving(Handler) as url:
        policy = VLLMPolicy(tokenizer=tokenizer, url=url, served_model="served")
        try:
            workers = [threading.Thread(target=rollout, args=(key,)) for key in ("a", "b")]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        finally:
            policy.close()
    assert all(not isinstance(r, Exception) for r in results.values()), results
    assert {key: r.completion_token_ids for key, r in results.items()} == {"a": [eot], "b": [eot]}


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not all(REAL.values()), reason="needs a vLLM server started with VLLM_SERVER_DEV_MODE=1: "
                                                  "set ORCHARD_VLLM_URL, ORCHARD_VLLM_MODEL and "
                                                  "ORCHARD_VLLM_TOKENIZER (docs/training.md)")
def test_a_guided_grpo_step_with_vllm_rollouts_changes_the_weights(tmp_path):
    """One real GRPO step with vLLM serving every rollout: the first rollout of the task is sampled by vLLM
    (the untrained policy fails it), the second plays the oracle's replies scored by vLLM
    (`prompt_logprobs`), the grader resolves it; the group's rewards differ, so the advantages are not zero
    and the step changes the weights. The weights reach the server through a reload before the rollouts."""
    from orchard.recipes.bar.config import BarConfig
    from orchard.recipes.rl.guide import GUIDED, SAMPLED
    from orchard.recipes.rl.train import RLConfig, train_rl

    task = "orchard__pagekit-112"
    reports = []
    config = RLConfig(model=REAL["ORCHARD_VLLM_TOKENIZER"], vllm_url=REAL["ORCHARD_VLLM_URL"],
                      vllm_model=REAL["ORCHARD_VLLM_MODEL"], out=tmp_path / "rl", tasks=[task], num_generations=2,
                      max_steps=1, learning_rate=1e-4, harness_options={"step_limit": 3}, max_tokens=24,
                      guide="oracle", bar=BarConfig(retire_after=2, max_rollouts=4))
    result = train_rl(config, on_step=reports.append)
    (report,) = reports
    assert {r["behaviour"]: r["reward"] for r in report.rollout_log} == {SAMPLED: 0.0, GUIDED: 1.0}
    assert report.informative_groups == 1 and report.trained_tokens > 0
    assert result.steps == 1 and result.weights_changed and result.losses
    assert not (tmp_path / "rl" / "vllm-weights").exists()  # the reload's copy is removed at the end
