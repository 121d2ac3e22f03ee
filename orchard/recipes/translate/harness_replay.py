"""Run a real harness on tasks with a scripted policy: the harness itself (Kimi-CLI, OpenHands, react, any
registered one) runs in the task's sandbox exactly as `orchard eval` runs it, and its model is a policy that
answers each call with the next reply of a fixed script. Two uses:

- **replaying a translation** (`replay_in_harness`): the script is a translated trajectory's replies, so
  the target harness's own tools run its tool calls; the rollout's patch (and grade) must be the source's.
  Its trajectory is what the target harness really recorded (observations in its own words, the requests
  as it sent them);
- **capturing a harness's prompt** (`capture_prompts`): an empty script (the policy's first reply calls no
  tool, which ends a Kimi-CLI or OpenHands run), so the first request the harness sent for a task — its
  system prompt, task message and tool definitions, rendered by the harness for that task — is recorded
  for translation into that harness (captured.py).

The script policy keeps no state per conversation: the reply to a request is the script's reply after as
many as the request's messages already hold (like the oracle), so a retried request gets the same answer.
Once the script is spent it replies without a tool call."""

from __future__ import annotations

import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.core.policy import Completion
from orchard.core.task import Task
from orchard.core.trajectory import Trajectory
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.policies.registry import serve_live, withdraw_live

REPLAY_ALIAS = "replay"
SCRIPT_END = "Done."  # the reply once a script is spent (no tool call: Kimi-CLI and OpenHands end there)


class ScriptPolicy:
    """A policy whose replies, per task, are a fixed list of assistant messages."""

    name = "script"
    description = "replies with a fixed script per task (replays of translated trajectories, prompt capture)"
    blocking = False

    def __init__(self, scripts: dict[str, list[dict[str, Any]]]) -> None:
        self.scripts = scripts
        self.first_requests: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self._tasks: dict[str, str] = {}  # rollout key -> task id
        self._lock = threading.Lock()

    def prepare_rollout(self, rollout_key: str, task: Task) -> None:
        with self._lock:
            self._tasks[rollout_key] = task.id

    def end_rollout(self, rollout_key: str) -> None:
        with self._lock:
            self._tasks.pop(rollout_key, None)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: dict[str, Any],
                 *, rollout_key: str | None, timeout_s: float | None) -> Completion:
        with self._lock:
            task_id = self._tasks.get(rollout_key or "", "")
            self.first_requests.setdefault(task_id, ([dict(m) for m in messages], list(tools or [])))
        script = self.scripts.get(task_id, [])
        done = sum(1 for message in messages if message.get("role") == "assistant")
        reply = dict(script[done]) if done < len(script) else {"role": "assistant", "content": SCRIPT_END}
        reply["role"] = "assistant"
        return Completion(message=reply, finish_reason="tool_calls" if reply.get("tool_calls") else "stop",
                          model=REPLAY_ALIAS)


@dataclass
class ScriptedRun:
    trajectories: dict[str, Trajectory] = field(default_factory=dict)  # task id -> the harness's rollout
    first_requests: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=dict)


async def run_scripted(harness: str, scripts: dict[str, list[dict[str, Any]]], *, suite: str | Path,
                       orchard_client: Any = None, parallel: int = 2, out_dir: Path | None = None,
                       harness_options: dict[str, Any] | None = None) -> ScriptedRun:
    """One rollout of `harness` per task of `scripts` (task id -> replies), through the evaluator.
    `orchard_client` gives the sandboxes of a harness that runs in Orchard's process; one that runs inside
    the sandbox (from a harness bundle) gets the evaluator's own embedded orchestrator ($ORCHARD_HOME),
    the one that can route its sandboxes to the run's gateway."""
    from orchard.core.harness import get_harness
    from orchard.core.jsonl import read_jsonl
    from orchard.eval.in_sandbox import harness_bundle
    from orchard.eval.runner import run_eval

    if harness_bundle(get_harness(harness, **(harness_options or {}))):
        orchard_client = None

    policy = ScriptPolicy(scripts)
    name = f"script-{uuid.uuid4().hex[:10]}"
    config = GatewayConfig(models={REPLAY_ALIAS: ModelRoute(model=serve_live(name, policy))}, allow_any_model=False)
    try:
        with tempfile.TemporaryDirectory(prefix="orchard-replay-") as scratch:
            out = out_dir or Path(scratch) / "run"
            await run_eval(harness=harness, model=REPLAY_ALIAS, suite=suite, out_dir=out, gateway_config=config,
                           task_ids=sorted(scripts), parallel=parallel, orchard_client=orchard_client,
                           harness_options=harness_options)
            trajectories = {t.task_id: t for t in read_jsonl(out / TRAJECTORIES_FILE, allow_interrupted_tail=False)}
    finally:
        withdraw_live(name)
    return ScriptedRun(trajectories=trajectories, first_requests=policy.first_requests)


def script_of(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The assistant replies of a (translated) trajectory, one per model call, in order."""
    replies = []
    for call in trajectory.llm_calls:
        choices = (call.response or {}).get("choices") or []
        if choices:
            replies.append(dict(choices[0]["message"]))
    return replies


async def replay_in_harness(trajectories: list[Trajectory], *, suite: str | Path, orchard_client: Any = None,
                            parallel: int = 2, out_dir: Path | None = None) -> dict[str, Trajectory]:
    """Each trajectory's replies played by its own harness (`agent.name`), for real, on its task: task id ->
    the rollout the harness recorded (its `outcome.details["patch"]` is the diff it left). The trajectories
    must be of one harness and of distinct tasks."""
    harnesses = {t.agent.name for t in trajectories}
    tasks = [t.task_id for t in trajectories]
    if len(harnesses) != 1 or len(set(tasks)) != len(tasks) or None in tasks:
        raise ValueError("replay_in_harness takes trajectories of one harness, each of its own task; got harnesses "
                         f"{sorted(harnesses)} and tasks {tasks}")
    scripts = {t.task_id: script_of(t) for t in trajectories}
    run = await run_scripted(harnesses.pop(), scripts, suite=suite, orchard_client=orchard_client,
                             parallel=parallel, out_dir=out_dir)
    return run.trajectories
