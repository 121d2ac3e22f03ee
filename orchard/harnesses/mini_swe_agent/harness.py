"""mini-swe-agent as an Orchard harness: the package's own `DefaultAgent` loop and config files, with its
Environment implemented on the Orchard sandbox and its Model calling through the gateway.

The agent loop is synchronous: it runs in a thread of its own while sandbox and model calls are bridged
back to the harness's event loop (bridge.py). Its native trajectory is converted to Orchard's (convert.py)
and kept in `extra["mini_swe_agent"]`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import minisweagent
from minisweagent.agents.default import AgentConfig, DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.models.utils.actions_toolcall import BASH_TOOL
from minisweagent.utils.serialize import recursive_merge
from pydantic import ValidationError

from orchard.core.deadline import Deadline
from orchard.core.errors import InvalidRequest, OrchardError, describe_validation_errors
from orchard.core.harness import ModelConfig, orchard_version
from orchard.core.sandbox import Sandbox
from orchard.core.run_status import ExitStatus
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Outcome, Trajectory
from orchard.harnesses.deadline import deadline_margin_s
from orchard.harnesses.mcp.install import McpToolsUnavailable, mcp_call_note
from orchard.harnesses.mini_swe_agent.bridge import LoopBridge, run_in_thread
from orchard.harnesses.mini_swe_agent.convert import convert_trajectory
from orchard.harnesses.mini_swe_agent.dialect import MiniSweAgentDialect
from orchard.harnesses.mini_swe_agent.environment import (OrchardSandboxEnvironment, SandboxCallFailed,
                                                          probe_system_info)
from orchard.harnesses.mini_swe_agent.model import GatewayModel, ModelCallFailed, Mode
from orchard.harnesses.openai_client import ChatClient

# The package's own default configs: `mini` is what its `mini` command runs (tool calling, v2's default);
# `mini_textbased` the text-mode variant.
DEFAULT_CONFIGS: dict[str, str] = {"toolcall": "mini", "text": "mini_textbased"}
DEFAULT_AGENT_CLASSES = frozenset({"", "default", "minisweagent.agents.default.DefaultAgent"})


class MiniSweAgentHarness:
    name = "mini-swe-agent"
    # The adapter's version with the wrapped package's as a local label (e.g. 0.1.0+minisweagent.2.1.0):
    # a change of either changes what the trajectories record and the evaluator's resume key.
    version = f"{orchard_version()}+minisweagent.{minisweagent.__version__}"
    mcp_tools = True  # through the `mcp-call` command in the sandbox, listed in the instruction (mcp/install.py)

    def __init__(self, config: str | Path | dict[str, Any] | None = None, *, mode: Mode = "toolcall",
                 overrides: dict[str, Any] | None = None, step_limit: int | None = None,
                 cost_limit: float | None = None, wall_time_limit_s: int | None = None,
                 command_timeout_s: int | None = None) -> None:
        """`config`: one of the package's config names (`mini`, `mini_textbased`, `swebench`, ...), a YAML
        path, or a config dict; default: the package's default for `mode`. `overrides` is merged over it
        (`{"agent": {...}, "environment": {...}, "model": {...}}`); the keyword limits override both."""
        if mode not in DEFAULT_CONFIGS:
            raise InvalidRequest(f"mode must be one of {sorted(DEFAULT_CONFIGS)}, not {mode!r}")
        self.mode = mode
        base = config if isinstance(config, dict) else _load_config(config or DEFAULT_CONFIGS[mode])
        limits = {"step_limit": step_limit, "cost_limit": cost_limit, "wall_time_limit_seconds": wall_time_limit_s}
        self.config = recursive_merge(
            base, overrides or {},
            {"agent": {key: value for key, value in limits.items() if value is not None}},
            {"environment": {"timeout": command_timeout_s}} if command_timeout_s is not None else {})
        self.agent_config = self._agent_config()

    def dialect(self) -> MiniSweAgentDialect:
        """Its tool, prompts and observations with this config, and the replay of its calls (dialect.py)."""
        return MiniSweAgentDialect(self)

    def _agent_config(self) -> dict[str, Any]:
        agent = dict(self.config.get("agent") or {})
        agent_class = agent.pop("agent_class", "")
        if agent_class not in DEFAULT_AGENT_CLASSES:
            raise InvalidRequest(f"the mini-swe-agent harness runs the package's DefaultAgent; agent_class "
                                 f"{agent_class!r} is not supported (interactive agents need a terminal)")
        agent["output_path"] = None  # the trajectory is returned, not written by the agent
        try:
            AgentConfig(**agent)
        except ValidationError as exc:
            problems = describe_validation_errors(exc, "agent")
            raise InvalidRequest(f"invalid mini-swe-agent agent config: {problems}") from None
        return agent

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        started = time.monotonic()
        workdir = task.environment.workdir
        bridge = LoopBridge(asyncio.get_running_loop())
        client = ChatClient(model)
        agent: DefaultAgent | None = None
        error: str | None = None
        error_status: ExitStatus = "agent_error"
        try:
            instruction = task.instruction + await mcp_call_note(sandbox, task)
            system_info = await probe_system_info(sandbox, workdir)
            environment = OrchardSandboxEnvironment(
                sandbox=sandbox, bridge=bridge, system_info=system_info, stop_at=_stop_at(model),
                **{**(self.config.get("environment") or {}), "cwd": workdir})
            gateway_model = GatewayModel(client=client, bridge=bridge,
                                         **{**(self.config.get("model") or {}), "model_name": model.model,
                                            "mode": self.mode})
            agent = DefaultAgent(gateway_model, environment, **_within_deadline(self.agent_config, model))
            await run_in_thread(lambda: agent.run(instruction), bridge, name=f"mini-swe-agent:{task.id}")
        except ModelCallFailed as exc:
            error, error_status = str(exc), "model_error"
        except SandboxCallFailed as exc:
            error, error_status = str(exc), "sandbox_error"
        except McpToolsUnavailable as exc:  # the task's MCP tools cannot be reached: its environment's fault
            error, error_status = str(exc), "environment_error"
        except OrchardError as exc:  # the sandbox failed before the agent started
            error, error_status = f"sandbox failed: {exc}", "sandbox_error"
        except Exception as exc:  # the agent loop itself failed (a template error, ...): not an attempt
            error, error_status = f"mini-swe-agent failed: {type(exc).__name__}: {exc}", "agent_error"
        finally:
            await client.aclose()
        native = agent.serialize() if agent is not None else {"info": {}, "messages": []}
        trajectory = convert_trajectory(
            native, agent=Agent(name=self.name, version=self.version, model_name=model.model,
                                tool_definitions=_tool_definitions(self.mode), extra={"mode": self.mode}),
            task_id=task.id, rollout_key=model.rollout_key, wall_time_s=time.monotonic() - started)
        if error is not None:
            trajectory.outcome = Outcome(error=error)
            trajectory.notes = error
            if trajectory.exit_status in (None, "stopped", "submitted"):
                trajectory.exit_status = error_status
        return trajectory


def _stop_at(model: ModelConfig) -> Deadline | None:
    """When the agent stops: the evaluator's deadline less its margin (deadline.py)."""
    time_left = model.time_left_s()
    return None if model.deadline is None else model.deadline.earlier_by(deadline_margin_s(time_left or 0.0))


def _within_deadline(agent_config: dict[str, Any], model: ModelConfig) -> dict[str, Any]:
    """The agent config with its wall-time limit brought forward to the evaluator's deadline (less a
    margin), so the package's own loop stops with `TimeExceeded` instead of being cut off (its commands are
    bounded by the same time: environment.py)."""
    time_left = model.time_left_s()
    if time_left is None:
        return agent_config
    left = max(1, int(time_left - deadline_margin_s(time_left)))
    own = agent_config.get("wall_time_limit_seconds") or 0
    return {**agent_config, "wall_time_limit_seconds": min(own, left) if own > 0 else left}


def _load_config(spec: str | Path) -> dict[str, Any]:
    try:
        return get_config_from_spec(spec)
    except FileNotFoundError:
        raise InvalidRequest(f"no mini-swe-agent config {str(spec)!r}: give one of the package's config names "
                             "(mini, mini_textbased, swebench, ...) or the path of a YAML file") from None


def _tool_definitions(mode: Mode) -> list[dict[str, Any]]:
    return [BASH_TOOL] if mode == "toolcall" else []
