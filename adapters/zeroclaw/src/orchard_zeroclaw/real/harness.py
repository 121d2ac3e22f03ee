"""The real ZeroClaw, inside the task's sandbox, on Orchard's in-sandbox base (`InSandboxHarness`): the driver
(driver.py) starts its gateway with the config of config.py, sends the task over `/ws/chat` and records the
frames; frames.py turns them into the trajectory. The binary is given one of two ways:

- `binary=PATH` (default `$ZEROCLAW_BIN`): an executable on this machine, copied into each sandbox in the
  harness-setup phase (`/tmp/.orchard-zeroclaw/bin/zeroclaw`); the driver runs from this distribution's
  `zeroclaw` harness bundle (Debian's Python only). The version recorded is this distribution's with the
  binary's digest, `+zeroclaw.bin.<sha256 prefix>`, so a resumed run refuses another binary;
- `bundle=NAME`: a harness bundle whose `entry` is ZeroClaw's command; the driver runs on its Python. The
  version recorded is `+zeroclaw.bundle.<name>` (a bundle's content is its spec's).

What `zeroclaw --version` printed is in `agent.extra["zeroclaw_version"]`.

How a run ends:

- ZeroClaw sends `done`: `submitted` (graded);
- it sends `error` saying it exceeded its maximum tool iterations: `step_limit` (graded);
- its model calls were refused for the rollout's budget: `budget_exhausted` (graded: a limit);
- it sends `error` after a failed model call (or with code `PROVIDER_ERROR`, `AUTH_ERROR`): `model_error`;
- it sends another `error`, or `aborted`, or closes the chat before `done`: `agent_error`, `partial`;
- its gateway does not start (the binary fails, exits, never answers `/health`, refuses `/ws/chat`):
  `agent_error`, with the gateway's log tail;
- it runs past its time (the evaluator's deadline less the margin, or `timeout_s`): `timeout`, `partial`;
- the driver itself fails (no result.json): `agent_error`, with its stderr tail.

The errors carry `Outcome(error=...)`: never the agent's failed attempt.

In every case the driver ends the gateway and all it started before it exits."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Trajectory
from orchard.harnesses.in_sandbox import AgentRun, Ending, Finished, InSandboxHarness, Launch, SandboxFile

from orchard_zeroclaw.real.bundle import SPEC as DRIVER_BUNDLE
from orchard_zeroclaw.real.config import AGENT, config_toml, relayed
from orchard_zeroclaw.real.frames import ZeroClawLog, trajectory_from_log
from orchard_zeroclaw.version import DIST_VERSION

STATE_DIR = "/tmp/.orchard-zeroclaw"
BINARY_PATH = f"{STATE_DIR}/bin/zeroclaw"
DRIVER_PATH = f"{STATE_DIR}/driver.py"
RUN_PATH = f"{STATE_DIR}/run.json"
APPROVALS = ("approve", "always", "deny")
AUTONOMY = ("full", "supervised")
MODEL_CODES = frozenset({"PROVIDER_ERROR", "AUTH_ERROR"})
ITERATION_CAP = "maximum tool iterations"  # ZeroClaw's "Agent exceeded maximum tool iterations (N)"
TAIL = 1500


class RealZeroClaw(InSandboxHarness):
    name: ClassVar[str] = "zeroclaw"
    state_dir = STATE_DIR
    time_limit_s = 3600.0
    mcp_tools = True

    def __init__(self, *, binary: str | None = None, bundle: str | None = None, step_limit: int = 50,
                 max_history_messages: int = 50, shell_timeout_s: float = 60, approval: str = "approve",
                 autonomy: str = "full", timeout_s: float | None = None) -> None:
        if approval not in APPROVALS:
            raise InvalidRequest(f"approval must be one of {', '.join(APPROVALS)} (how the driver answers ZeroClaw's "
                                 f"approval_request frames), not {approval!r}")
        if autonomy not in AUTONOMY:
            raise InvalidRequest(f"autonomy must be one of {', '.join(AUTONOMY)}, not {autonomy!r}")
        for option, value in (("step_limit", step_limit), ("max_history_messages", max_history_messages),
                              ("shell_timeout_s", shell_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise InvalidRequest(f"{option} must be a positive number, not {value!r}")
        if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
            raise InvalidRequest(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        self.step_limit, self.max_history_messages = int(step_limit), int(max_history_messages)
        self.shell_timeout_s, self.approval, self.autonomy = shell_timeout_s, approval, autonomy
        self.timeout_s = timeout_s
        self.binary: Path | None = None
        if binary:
            path = Path(binary).expanduser()
            if not path.is_file():
                raise InvalidRequest(f"the ZeroClaw binary {binary} (binary option or $ZEROCLAW_BIN) is not a file")
            if not os.access(path, os.X_OK):
                raise InvalidRequest(f"the ZeroClaw binary {binary} is not executable (chmod +x it)")
            self.binary, self.bundle = path.resolve(), DRIVER_BUNDLE.name
            self.version = f"{DIST_VERSION}+zeroclaw.bin.{_digest(self.binary)[:12]}"
        else:
            spec = get_bundle_spec(str(bundle))  # an unknown bundle is refused here, naming the known ones
            if not spec.entry:
                raise InvalidRequest(f"harness bundle {bundle!r} declares no entry command: the real ZeroClaw runs the "
                                     "bundle's entry as its `zeroclaw` command")
            self.bundle = spec.name
            self.version = f"{DIST_VERSION}+zeroclaw.bundle.{spec.name}"

    # --- the phases -----------------------------------------------------------------------------------

    async def setup(self, task: Task, sandbox: Sandbox) -> None:
        """The binary's copy in the sandbox (with `binary`; a bundle carries its own)."""
        if self.binary is not None:
            await sandbox.exec(["mkdir", "-p", f"{STATE_DIR}/bin"], timeout=30)
            await sandbox.write_file(BINARY_PATH, self.binary.read_bytes(), mode=0o755)

    async def launch(self, run: AgentRun, sandbox: Sandbox) -> Launch:
        """The driver on the bundle's Python (`-I`: the task's environment cannot redirect it), its run file,
        and ZeroClaw's config with the rollout's key (mode 0600)."""
        if self.binary is not None:
            try:
                await sandbox.stat(BINARY_PATH)
            except NotFound:  # run without the setup phase (a direct call of run): place it now
                await self.setup(run.task, sandbox)
        upstream, _ = relayed(run.model.base_url or "")
        config = config_toml(run.model, run.task, step_limit=self.step_limit,
                             max_history_messages=self.max_history_messages, shell_timeout_s=self.shell_timeout_s,
                             autonomy=self.autonomy)
        zeroclaw = [BINARY_PATH] if self.binary is not None else run.spec.entry_argv()
        settings: dict[str, Any] = {
            "zeroclaw": zeroclaw, "state_dir": STATE_DIR, "config_dir": f"{STATE_DIR}/config", "config": config,
            "upstream": upstream, "agent": AGENT, "workdir": run.workdir, "message": run.task.instruction,
            "approval": self.approval, "time_limit_s": run.time_limit_s, "health_timeout_s": 60}
        driver = resources.files("orchard_zeroclaw.real").joinpath("driver.py").read_bytes()
        python = f"{run.spec.mount_point()}/venv/bin/python"
        env = {**(run.spec.entry_env() if self.binary is None else {}), "PYTHONUNBUFFERED": "1"}
        return Launch(argv=[python, "-I", DRIVER_PATH, RUN_PATH], env=env,
                      files=[SandboxFile(path=DRIVER_PATH, data=driver),
                             SandboxFile(path=RUN_PATH, data=json.dumps(settings).encode(), mode=0o600)])

    async def collect(self, run: AgentRun, sandbox: Sandbox, result: ExecResult) -> ZeroClawLog:
        return await ZeroClawLog.read(sandbox, STATE_DIR)

    def convert(self, log: ZeroClawLog | None, run: AgentRun, result: ExecResult) -> Trajectory:
        log = log if log is not None else ZeroClawLog(STATE_DIR)
        agent = self.agent(run, extra={"zeroclaw_version": (log.result or {}).get("version"),
                                       "binary" if self.binary is not None else "bundle":
                                           str(self.binary) if self.binary is not None else self.bundle})
        trajectory = trajectory_from_log(log, agent, run.task.instruction)
        trajectory.extra["native_logs"] = log.native_logs()
        trajectory.extra["zeroclaw_result"] = {key: value for key, value in (log.result or {}).items()
                                               if key != "gateway_log_tail"}
        return trajectory

    def ending(self, run: AgentRun, finished: Finished, log: ZeroClawLog | None, trajectory: Trajectory) -> Ending:
        result = finished.result
        log = log if log is not None else ZeroClawLog(STATE_DIR)
        outcome = log.result or {}
        ending, said = outcome.get("ending"), _said(outcome)
        if result.timed_out or ending == "timeout":
            error = f"zeroclaw ran past its time limit and was stopped with everything it started{said}"
            if finished.unread is not None:
                error = f"{error}; {finished.unread}"
            return Ending(exit_status="timeout", error=error, partial=True)
        if ending is None:
            stderr = (result.stderr or "").strip()[-TAIL:]
            return Ending(exit_status="agent_error", partial=True,
                          error=f"the ZeroClaw driver exited with code {result.exit_code} without its result"
                                + (f"; stderr: {stderr}" if stderr else ""))
        if ending == "done":
            return Ending(exit_status="submitted")
        if ending == "error" and ITERATION_CAP in str(outcome.get("error")):
            return Ending(exit_status="step_limit", notes=f"stopped: {outcome.get('error')}")
        last = log.last_call()
        if last is not None and last.get("error") and "budget_exceeded" in str(last.get("error")):
            return Ending(exit_status="budget_exhausted",
                          notes="stopped: the gateway refused further calls, this rollout's budget is used up")
        if ending == "error" and (outcome.get("code") in MODEL_CODES or (last is not None and last.get("error"))):
            detail = (last or {}).get("error") or outcome.get("error")
            return Ending(exit_status="model_error", partial=True,
                          error=f"zeroclaw's model calls failed: {str(detail)[:TAIL]}{said}")
        what = {"error": f"zeroclaw reported an error ({outcome.get('code') or 'no code'}): {outcome.get('error')}",
                "aborted": "zeroclaw aborted the turn",
                "closed": "zeroclaw's gateway closed the chat before the turn ended",
                "start_failed": f"zeroclaw did not start: {outcome.get('error')}"}.get(
            ending, f"the driver ended with {ending!r}: {outcome.get('error')}")
        return Ending(exit_status="agent_error", error=f"{what}{said}", partial=True)


def _said(outcome: dict[str, Any]) -> str:
    log = (outcome.get("gateway_log_tail") or "").strip()
    parts = []
    if outcome.get("gateway_exit") not in (None, 0):
        parts.append(f"its gateway exited with code {outcome['gateway_exit']}")
    if log:
        parts.append(f"its log ends: {log[-TAIL:]}")
    return "; " + "; ".join(parts) if parts else ""


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
