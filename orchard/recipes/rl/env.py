"""Where RL rollouts run: real trials (orchard.eval.trial — sandbox, harness, patch, grader) of a harness on
tasks, with the policy served through the run's own gateway (`LocalGateway`, alias `policy`).

The trainer calls in from its own thread; the trials run on an event loop in a background thread, so the
trainer's synchronous `rollout_func` can start many at once (`parallel` agents, as many gradings) and
wait for each. `TrainingPolicy` answers the gateway from the same process with the trainer's weights —
while rollouts run, the trainer waits, so the weights never change mid-rollout."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

from orchard.core.harness import SamplingParams, get_harness
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Outcome, Trajectory
from orchard.eval.local_gateway import LocalGateway
from orchard.eval.run_config import TrialTimeouts
from orchard.eval.trial import Trial, TrialRig
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.policies.registry import serve_live, withdraw_live

POLICY_ALIAS = "policy"
_T = TypeVar("_T")


class RolloutEnv:
    """`with RolloutEnv(policy, ...) as env: env.rollout(task)` — or `await env.arollout(task)` on
    `env.loop`. `route` overrides where the gateway's `policy` alias goes (e.g. a vLLM server:
    `ModelRoute(model="hosted_vllm/NAME", api_base=..., params={"logprobs": True, "extra_body":
    {"return_token_ids": True}})`); by default it is the in-process `policy`."""

    def __init__(self, policy: Any | None, *, harness: str = "react", harness_options: dict[str, Any] | None = None,
                 sampling: SamplingParams | None = None, parallel: int = 1,
                 timeouts: TrialTimeouts | None = None, route: ModelRoute | None = None,
                 model: str = POLICY_ALIAS, orchard_url: str | None = None, pass_threshold: float = 1.0) -> None:
        self.policy = policy
        # the suite's: a script or services grader's reward resolves a task from this on (Claw's 0.75), as in
        # `orchard eval`; the GRPO reward is the grader's reward itself, whatever the threshold
        self.pass_threshold = pass_threshold
        self.harness = get_harness(harness, **(harness_options or {}))
        self.sampling = sampling or SamplingParams(temperature=1.0, max_tokens=256)
        self.parallel = parallel
        self.timeouts = timeouts or TrialTimeouts(agent_s=600, trial_s=1200)
        self.model = model
        self._route = route
        self._orchard_url = orchard_url
        self._name = f"policy-{uuid.uuid4().hex[:10]}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="orchard-rl-rollouts", daemon=True)
        self.gateway: LocalGateway | None = None
        self._orch = None
        self.rig: TrialRig | None = None

    # --- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> RolloutEnv:
        models: dict[str, ModelRoute] = {}
        if self._route is not None:
            models[self.model] = self._route
        elif self.policy is not None:
            models[self.model] = ModelRoute(model=serve_live(self._name, self.policy))
        self._thread.start()
        try:
            self.gateway = LocalGateway(GatewayConfig(models=models, allow_any_model=False))
            self.gateway.start()
            self.call(self._open())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._orch is not None:
            try:
                self.call(self._orch.__aexit__(None, None, None))
            finally:
                self._orch = None
        if self.gateway is not None:
            self.gateway.stop()
        withdraw_live(self._name)
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)

    async def _open(self) -> None:
        from orchard.sandbox.client import AsyncOrchard

        self._orch = AsyncOrchard(self._orchard_url)
        orch = await self._orch.__aenter__()
        self.rig = TrialRig(harness=self.harness, model=self.model, sampling=self.sampling, timeouts=self.timeouts,
                            orch=orch, gateway=self.gateway, agent_slots=asyncio.Semaphore(self.parallel),
                            grading_slots=asyncio.Semaphore(self.parallel), labels={"orchard.train/run": "rl"},
                            pass_threshold=self.pass_threshold)

    def call(self, work: Awaitable[_T]) -> _T:
        """Run `work` on the rollout loop and wait for it (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    # --- rollouts ------------------------------------------------------------------------------------

    async def arollout(self, task: Task, rollout_key: str | None = None) -> Trajectory:
        """One graded rollout. Never raises (but on cancellation): anything that goes wrong outside the
        trial's own handling becomes an `agent_error` trajectory, an infrastructure error."""
        assert self.rig is not None, "use RolloutEnv as a context manager"
        key = rollout_key or f"rl-{uuid.uuid4().hex[:12]}"
        started = time.monotonic()
        try:
            return await Trial(self.rig, task, key, {"orchard.train/task": _label(task.id)}).run()
        except Exception as exc:  # noqa: BLE001 — one failed rollout must not fail the training step
            error = f"rollout failed outside the trial: {type(exc).__name__}: {exc}"
            return Trajectory(agent=Agent(name=self.harness.name, version=self.harness.version, model_name=self.model),
                              task_id=task.id, rollout_key=key, exit_status="agent_error", notes=error,
                              outcome=Outcome(error=error), extra={"wall_s": time.monotonic() - started})
        finally:
            forget = getattr(self.policy, "forget", None)
            if forget is not None:
                forget(key)

    def rollout(self, task: Task, rollout_key: str | None = None) -> Trajectory:
        return self.call(self.arollout(task, rollout_key))


def _label(value: str) -> str:
    """A label value (63 characters at most, alphanumerics and -_.)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in value)[:63].strip("-_.")
    return cleaned or "task"
