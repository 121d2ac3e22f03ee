"""mini-swe-agent's `Environment` protocol on an Orchard sandbox.

It behaves as the package's own environments (`LocalEnvironment`, `DockerEnvironment`) do: `execute`
returns `{"output", "returncode", "exception_info"}` with stderr merged into the output, a timeout comes
back as an output with return code -1 and the same `exception_info` text, and a command whose output
starts with the line `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (exit code 0) raises the package's
`Submitted`, carrying the rest of the output as the submission. A failing sandbox raises
`SandboxCallFailed`, which ends the run as an error."""

from __future__ import annotations

import math
import subprocess
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel, ConfigDict

from orchard.core.deadline import Deadline
from orchard.core.errors import OrchardError
from orchard.core.sandbox import Sandbox
from orchard.harnesses.mini_swe_agent.bridge import LoopBridge
from orchard.harnesses.shell_command import shell_argv

SUBMIT_COMMAND_OUTPUT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
UNAME_FIELDS = ("system", "node", "release", "version", "machine")
# `uname` options giving platform.uname()'s fields, one per line (-v has spaces, so one call per field).
UNAME_COMMAND = "; ".join(f"uname {flag}" for flag in ("-s", "-n", "-r", "-v", "-m"))


class SandboxCallFailed(Exception):
    """The sandbox failed under a command (lost, unreachable): the rollout is an error."""


class OrchardEnvironmentConfig(BaseModel):
    # The package's config files also carry keys for its Docker/Singularity environments (image,
    # run_args, environment_class, ...); they do not apply to a sandbox and are ignored.
    model_config = ConfigDict(extra="ignore")

    cwd: str = ""
    env: dict[str, str] = {}
    timeout: int = 30
    interpreter: list[str] = ["bash", "-c"]


class OrchardSandboxEnvironment:
    def __init__(self, *, sandbox: Sandbox, bridge: LoopBridge, system_info: dict[str, str],
                 config_class: type = OrchardEnvironmentConfig, stop_at: Deadline | None = None,
                 **kwargs: Any) -> None:
        """`stop_at` (None: never): no command runs past it, so a hanging command cannot carry
        the run past the evaluator's deadline (the loop then stops on its wall-time limit)."""
        self.config = config_class(**kwargs)
        self.sandbox = sandbox
        self.bridge = bridge
        self.system_info = system_info
        self.stop_at = stop_at

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        if self.stop_at is not None:
            timeout = max(1, min(timeout, math.ceil(self.stop_at.time_left_s())))
        try:
            result = self.bridge.call(self.sandbox.exec(
                shell_argv(command, self.config.interpreter), cwd=cwd or self.config.cwd or None,
                env=dict(self.config.env) or None, timeout=timeout))
        except OrchardError as exc:
            raise SandboxCallFailed(f"sandbox failed: {exc}") from exc
        if result.timed_out:
            error = subprocess.TimeoutExpired(command, timeout)  # the exception LocalEnvironment reports
            output = {"output": result.output, "returncode": -1,
                      "exception_info": f"An error occurred while executing the command: {error}",
                      "extra": {"exception_type": type(error).__name__, "exception": str(error)}}
        else:
            output = {"output": result.output, "returncode": result.exit_code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        """Raises Submitted if the output indicates task completion (as the package's environments do)."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_COMMAND_OUTPUT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), self.system_info, kwargs)

    def serialize(self) -> dict:
        return {"info": {"config": {
            "environment": self.config.model_dump(mode="json"),
            "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
            "sandbox_id": self.sandbox.id}}}


async def probe_system_info(sandbox: Sandbox, cwd: str) -> dict[str, str]:
    """platform.uname()'s fields as seen inside the sandbox: the package's prompts show them
    (`{{system}} {{release}} {{version}} {{machine}}`), and they must describe where commands run."""
    result = await sandbox.exec(["sh", "-c", UNAME_COMMAND], cwd=cwd, timeout=30)
    values = result.stdout.splitlines() if result.exit_code == 0 else []
    if len(values) != len(UNAME_FIELDS):
        values = ["unknown"] * len(UNAME_FIELDS)  # an image without uname: the prompt says so
    info = dict(zip(UNAME_FIELDS, values))
    info["processor"] = info["machine"]
    return info
