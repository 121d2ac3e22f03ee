"""The suite's rig: one evaluation of the harness under test over the conformance tasks (every scenario at
once, through the real evaluator, its gateway and embedded sandboxes), one run of the harness on a sandbox
that is lost from the start, and the fixtures and class attributes every check shares."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchard.core.deadline import Deadline
from orchard.core.harness import Harness, ModelConfig, get_harness, setup_harness
from orchard.core.jsonl import read_jsonl
from orchard.core.trajectory import Trajectory
from orchard.eval.local_gateway import LocalGateway
from orchard.eval.results import TRAJECTORIES_FILE, EvalResults, TaskResult
from orchard.eval.run_config import TrialTimeouts
from orchard.eval.runner import run_eval
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.policies.registry import get_policy, provider_model
from orchard.sandbox.sync import LoopThread
from orchard.testing.harness_conformance.model import MODEL_PATH
from orchard.testing.harness_conformance.scenarios import SCENARIOS, SOLVE, WORKDIR, conformance_suite, task_id
from orchard.testing.memory_sandbox import MemorySandbox

MODEL = "conformance"  # the gateway alias the harness is given as its model
RUN_TIMEOUT_S = 900.0  # the whole evaluation, bundle build included: a harness that hangs fails, not stalls
LOST_REASON = "the harness conformance suite lost it on purpose"


def gateway_config() -> GatewayConfig:
    """A gateway serving the conformance model as `conformance`."""
    return GatewayConfig(models={MODEL: ModelRoute(model=provider_model(MODEL_PATH))})


@dataclass
class ConformanceRun:
    """What the evaluation of every scenario gave: its results and a trajectory per scenario."""

    harness: Harness
    results: EvalResults
    trajectories: dict[str, Trajectory]
    out_dir: Path

    def trajectory(self, scenario: str) -> Trajectory:
        return self.trajectories[scenario]

    def row(self, scenario: str) -> TaskResult:
        return next(row for row in self.results.tasks if row.task_id == task_id(scenario))


@dataclass
class LostSandboxRun:
    """The harness's setup and run on a sandbox lost from the start: what it returned, or what it raised."""

    sandbox: MemorySandbox
    trajectory: Trajectory | None
    raised: BaseException | None


class HarnessConformanceRig:
    """The fixtures of every check; `HarnessConformance` is what a harness's test class subclasses."""

    harness: ClassVar[str] = ""  # a registered harness name, or an import path `module:Class`
    harness_options: ClassVar[dict[str, Any]] = {}  # passed to the harness as `orchard eval` passes them
    image: ClassVar[str] = "host"  # the tasks' sandbox image: a POSIX shell with echo, cat, grep and sleep
    backend: ClassVar[str] = "local"  # the embedded orchestrator's backend
    # The agent's time in every scenario (its ModelConfig.deadline): long enough for the harness to start
    # and solve a one-command task on a busy machine, short enough that the deadline scenario stays quick.
    deadline_s: ClassVar[float] = 20.0
    # Checks that cannot apply to this harness, by test name, each with the reason (the test is skipped
    # saying it); anything else a harness fails is a finding to fix in the harness.
    not_applicable: ClassVar[dict[str, str]] = {}

    def applies(self, request: pytest.FixtureRequest) -> None:
        """Skip the running check, naming the reason, when the harness declared it not applicable."""
        reason = self.not_applicable.get(request.node.originalname)
        if reason is not None:
            pytest.skip(f"not applicable to harness {self.harness!r}: {reason}")

    # --- what a harness may provide ---------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def orchard_home(cls, tmp_path_factory) -> Path:
        """The Orchard home the evaluation runs in (its cache holds the agent bundle and, for a harness that
        runs inside the sandbox, its harness bundle, built there on first use). Override it to share one."""
        return tmp_path_factory.mktemp("harness-conformance-home")

    # --- the suite's own fixtures -------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def loop(cls) -> Iterator[LoopThread]:
        thread = LoopThread("orchard-harness-conformance")
        yield thread
        thread.close()

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_run(cls, orchard_home, loop, tmp_path_factory) -> ConformanceRun:
        if not cls.harness:
            pytest.fail("a HarnessConformance subclass must set `harness` (a registered name or module:Class)",
                        pytrace=False)
        out = tmp_path_factory.mktemp("harness-conformance-run")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ORCHARD_HOME", str(orchard_home))
            results = loop.run(run_eval(
                harness=cls.harness, model=MODEL, suite=conformance_suite(cls.image), out_dir=out,
                gateway_config=gateway_config(), parallel=len(SCENARIOS), harness_options=dict(cls.harness_options),
                timeouts=TrialTimeouts(agent_s=cls.deadline_s), backend=cls.backend), RUN_TIMEOUT_S)
        by_task = {trajectory.task_id: trajectory
                   for trajectory in read_jsonl(out / TRAJECTORIES_FILE, Trajectory, allow_interrupted_tail=False)}
        return ConformanceRun(harness=get_harness(cls.harness, **cls.harness_options), results=results,
                              trajectories={scenario: by_task[task_id(scenario)] for scenario in SCENARIOS},
                              out_dir=out)

    @pytest.fixture(scope="class")
    @classmethod
    def lost_sandbox_run(cls, orchard_home, loop) -> LostSandboxRun:
        """The harness set up and run as the evaluator would, on a `MemorySandbox` whose every call raises
        SandboxLost, its model the conformance model behind a real gateway (the solve scenario)."""
        harness = get_harness(cls.harness, **cls.harness_options)
        task = conformance_suite(cls.image).get(task_id(SOLVE))
        sandbox = MemorySandbox(workdir=WORKDIR, sandbox_id="harness-conformance-lost")
        sandbox.lose(LOST_REASON)
        policy = get_policy(MODEL_PATH)
        key = f"harness-conformance-lost-{uuid.uuid4().hex[:12]}"
        with pytest.MonkeyPatch.context() as patch, LocalGateway(gateway_config()) as gateway:
            patch.setenv("ORCHARD_HOME", str(orchard_home))
            policy.prepare_rollout(key, task)
            model = ModelConfig(model=MODEL, base_url=gateway.base_url, api_key=gateway.api_key, rollout_key=key,
                                timeout_s=30, deadline=Deadline.after(cls.deadline_s))
            visible = task.model_copy(update={"grader": None})

            async def attempt() -> Trajectory:
                await setup_harness(harness, visible, sandbox)
                return await harness.run(visible, sandbox, model)

            try:
                return LostSandboxRun(sandbox, loop.run(attempt(), cls.deadline_s + 60), None)
            except Exception as exc:  # what it raised is the finding; the checks judge it
                return LostSandboxRun(sandbox, None, exc)
            finally:
                policy.end_rollout(key)
                gateway.end_rollout(key)
