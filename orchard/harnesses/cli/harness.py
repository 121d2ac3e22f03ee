"""`cli`: a harness that needs no adapter code. It runs a command inside the task's sandbox, from a harness
bundle, with the rollout's model reachable the way most CLI agents take it:

    orchard eval --harness cli --harness-option bundle=mini-swe-agent \
        --harness-option command='{entry} -y --exit-immediately -m openai/{model} -t "$(cat {instruction_file})"' ...

- `OPENAI_BASE_URL` (and `OPENAI_API_BASE`), `OPENAI_API_KEY`, `OPENAI_MODEL` are the rollout's own
  gateway URL, key and model; the bundle spec's `env` and the `env` option come on top;
- the command (placeholders: command.py) runs under `/bin/sh -c` in the task's workdir, killed with its
  whole process group a little before the evaluator's deadline;
- the steps are rebuilt by the evaluator from the gateway's records of the rollout (`steps_from_gateway`,
  orchard/eval/partial.py): the harness itself returns only how the program ended;
- exit code 0 is the agent's own end (`submitted`); a crash (another exit code), a hang past the timeout
  and (in the evaluator) a program that never called the model are errors, the program's stderr tail in
  the error. Its stdout and stderr, and the files named by `native_logs`, are kept as native logs.

Without `bundle` the harness refuses to be made: the evaluator gives the gateway only to sandboxes of a
harness that runs from a bundle, so a program of the task image could not reach the model."""

from __future__ import annotations

import math
import shlex
from typing import Any

from orchard.core.errors import InvalidRequest
from orchard.core.harness import ModelConfig, orchard_version
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Outcome, Trajectory
from orchard.harnesses.cli.command import check_template, fill
from orchard.harnesses.deadline import after_stop, run_limit_s

SCRATCH = "/tmp/orchard-cli"
INSTRUCTION_FILE = f"{SCRATCH}/instruction.md"
STDOUT_LOG, STDERR_LOG = f"{SCRATCH}/stdout.log", f"{SCRATCH}/stderr.log"
DEFAULT_TIMEOUT_S = 3600.0  # without an evaluator's deadline
TAIL_CHARS = 2000  # of stderr, in the error and notes


class CliHarness:
    name = "cli"
    version = orchard_version()
    steps_from_gateway = True  # the Trial rebuilds the steps from the rollout's gateway records

    def __init__(self, command: str | None = None, bundle: str | None = None, *,
                 env: dict[str, str] | None = None, native_logs: list[str] | None = None,
                 timeout_s: float | None = None) -> None:
        """`command`: the shell command (placeholders: orchard/harnesses/cli/command.py); `bundle`: the harness
        bundle it runs from; `env`: more environment (placeholders allowed, not quoted); `native_logs`:
        files the program writes (e.g. `{scratch}/run.json`) to keep beside the trajectory; `timeout_s`:
        a limit of its own, below the evaluator's deadline."""
        if not command or not str(command).strip():
            raise InvalidRequest("the cli harness needs the command to run: --harness-option command='...' "
                                 "(e.g. '{entry} --task {instruction}'; see docs/harnesses.md)")
        if not bundle:
            raise InvalidRequest("the cli harness needs a harness bundle to run from: --harness-option bundle=NAME "
                                 "(`orchard harness bundles` lists them); only a harness running from a bundle gets "
                                 "the model gateway inside its sandbox")
        if not isinstance(bundle, str):
            raise InvalidRequest(f"the cli harness's bundle must be a bundle's name, not {bundle!r}")
        if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in env.items())):
            raise InvalidRequest("the cli harness's env must map names to strings, e.g. env='{\"HOME\": \"{scratch}\"}'")
        if native_logs is not None and not (isinstance(native_logs, list)
                                            and all(isinstance(path, str) for path in native_logs)):
            raise InvalidRequest("the cli harness's native_logs must be a list of paths in the sandbox")
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise InvalidRequest(f"the cli harness's timeout_s must be a positive number of seconds, not {timeout_s!r}")
        self.command, self.bundle = str(command), bundle
        self.env, self.native_logs, self.timeout_s = dict(env or {}), list(native_logs or []), timeout_s
        check_template(self.command, "command")
        for key, value in self.env.items():
            check_template(value, f"env {key}")
        for path in self.native_logs:
            check_template(path, "native_logs")
        self.spec = get_bundle_spec(bundle)  # an unknown bundle is refused here, naming the known ones

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        timeout = self._timeout(model)
        values = self._values(task, model, timeout)
        await sandbox.exec(["mkdir", "-p", SCRATCH], timeout=30)
        await sandbox.write_file(INSTRUCTION_FILE, task.instruction)
        result = await sandbox.exec(["/bin/sh", "-c", fill(self.command, values, quote=True)],
                                    cwd=task.environment.workdir, env=self._environment(model, values),
                                    timeout=timeout)
        unkept = None
        if result.timed_out:  # our own kill fired: the agent's timeout, whatever keeping its output meets
            _, unkept = await after_stop(model, lambda: self._keep_output(sandbox, result))
        else:
            await self._keep_output(sandbox, result)
        trajectory = Trajectory(
            agent=Agent(name=self.name, version=self.version, model_name=model.model,
                        extra={"bundle": self.bundle, "command": self.command}),
            task_id=task.id, rollout_key=model.rollout_key,
            extra={"exit_code": result.exit_code, "timed_out": result.timed_out,
                   "native_logs": [STDOUT_LOG, STDERR_LOG, *(fill(path, values, quote=False)
                                                             for path in self.native_logs)]})
        _settle(trajectory, result, timeout)
        if unkept is not None and trajectory.outcome is not None:
            trajectory.outcome.error = trajectory.notes = f"{trajectory.outcome.error}; {unkept}"
        return trajectory

    @staticmethod
    async def _keep_output(sandbox: Sandbox, result: ExecResult) -> None:
        await sandbox.write_file(STDOUT_LOG, result.stdout)
        await sandbox.write_file(STDERR_LOG, result.stderr)

    def _timeout(self, model: ModelConfig) -> float:
        """Killed a margin before the evaluator's deadline (orchard/harnesses/deadline.py), so its end is the
        harness's to report (its stderr tail) rather than the evaluator's cut-off."""
        limit = run_limit_s(model, self.timeout_s or None, DEFAULT_TIMEOUT_S)
        assert limit is not None
        return limit

    def _values(self, task: Task, model: ModelConfig, timeout: float) -> dict[str, str]:
        return {"instruction_file": INSTRUCTION_FILE, "instruction": task.instruction,
                "workdir": task.environment.workdir, "model": model.model, "base_url": model.base_url or "",
                "bundle": self.spec.mount_point(), "entry": shlex.join(self.spec.entry_argv()),
                "scratch": SCRATCH, "timeout_s": str(max(1, math.floor(timeout)))}

    def _environment(self, model: ModelConfig, values: dict[str, str]) -> dict[str, str]:
        if not model.base_url or model.api_key is None:
            raise InvalidRequest("the cli harness runs a program inside the sandbox and needs the gateway's URL and "
                                 "key there; run it through `orchard eval`, which gives them")
        key = model.api_key.get_secret_value()
        env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_BASE": model.base_url, "OPENAI_API_KEY": key,
               "OPENAI_MODEL": model.model}
        env.update(self.spec.entry_env())
        env.update({name: fill(value, values, quote=False) for name, value in self.env.items()})
        return env


def _settle(trajectory: Trajectory, result: ExecResult, timeout: float) -> None:
    """exit_status, outcome and notes from how the program ended."""
    tail = _tail(result.stderr)
    said = f"stderr ends: {tail}" if tail else "nothing on stderr"
    if result.timed_out:
        error = f"timeout: the program ran past its {timeout:.0f} s and was killed with its process group; {said}"
        trajectory.exit_status, trajectory.outcome = "timeout", Outcome(error=error)
    elif result.exit_code != 0:
        error = f"the program exited with code {result.exit_code}; {said}"
        trajectory.exit_status, trajectory.outcome = "agent_error", Outcome(error=error)
    else:
        trajectory.exit_status = "submitted"
    trajectory.notes = trajectory.outcome.error if trajectory.outcome else f"exit code 0, {said}"


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]
