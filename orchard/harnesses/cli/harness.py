"""`cli`: a harness that needs no adapter code. It runs a command inside the task's sandbox, from a harness
bundle, with the rollout's model reachable the way most CLI agents take it:

    orchard eval --harness cli --harness-option bundle=mini-swe-agent \
        --harness-option command='{entry} -y --exit-immediately -m openai/{model} -t "$(cat {instruction_file})"' ...

- `OPENAI_BASE_URL` (and `OPENAI_API_BASE`), `OPENAI_API_KEY`, `OPENAI_MODEL` are the rollout's own
  gateway URL, key and model; the bundle spec's `env` and the `env` option come on top;
- the command (placeholders: command.py) runs under `/bin/sh -c` in the task's workdir, killed with its
  whole process group a little before the evaluator's deadline (the in-sandbox base,
  orchard/harnesses/in_sandbox/);
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

from orchard.core.errors import InvalidRequest
from orchard.core.harness import orchard_version
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.trajectory import Trajectory
from orchard.harnesses.cli.command import check_template, fill
from orchard.harnesses.in_sandbox import AgentRun, Ending, Finished, InSandboxHarness, Launch, SandboxFile

SCRATCH = "/tmp/orchard-cli"
INSTRUCTION_FILE = f"{SCRATCH}/instruction.md"
STDOUT_LOG, STDERR_LOG = f"{SCRATCH}/stdout.log", f"{SCRATCH}/stderr.log"
TAIL_CHARS = 2000  # of stderr, in the error and notes


class CliHarness(InSandboxHarness):
    name = "cli"
    version = orchard_version()
    state_dir = SCRATCH
    default_time_limit_s = 3600.0  # without an evaluator's deadline
    steps_from_gateway = True  # the Trial rebuilds the steps from the rollout's gateway records
    # A task's MCP servers reach the program as a config file in the `mcpServers` shape ($ORCHARD_MCP_CONFIG)
    # and the `mcp-call` command (docs/tools-mcp.md): the program takes them as it does.
    mcp_tools = True

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

    async def launch(self, run: AgentRun, sandbox: Sandbox) -> Launch:
        values = self._values(run)
        return Launch(argv=["/bin/sh", "-c", fill(self.command, values, quote=True)],
                      env=self._environment(run, values),
                      files=[SandboxFile(path=INSTRUCTION_FILE, data=run.task.instruction.encode())])

    async def collect(self, run: AgentRun, sandbox: Sandbox, result: ExecResult) -> None:
        """The program's stdout and stderr, kept as files beside those it writes itself."""
        await sandbox.write_file(STDOUT_LOG, result.stdout)
        await sandbox.write_file(STDERR_LOG, result.stderr)

    def convert(self, log: None, run: AgentRun, result: ExecResult) -> Trajectory:
        """No steps: the evaluator rebuilds them from the gateway's records; only how the program ended."""
        values = self._values(run)
        return Trajectory(
            agent=self.agent(run, extra={"bundle": self.bundle, "command": self.command}),
            extra={"exit_code": result.exit_code, "timed_out": result.timed_out,
                   "native_logs": [STDOUT_LOG, STDERR_LOG, *(fill(path, values, quote=False)
                                                             for path in self.native_logs)]})

    def ending(self, run: AgentRun, finished: Finished, log: None, trajectory: Trajectory) -> Ending:
        """Exit code 0 is the agent's own end; a crash or a hang past the time limit is an error, with the
        program's stderr tail."""
        result = finished.result
        tail = _tail(result.stderr)
        said = f"stderr ends: {tail}" if tail else "nothing on stderr"
        if result.timed_out:
            error = (f"timeout: the program ran past its {run.time_limit_s:.0f} s and was killed with its process "
                     f"group; {said}")
            if finished.unread is not None:
                error = f"{error}; {finished.unread}"
            return Ending(exit_status="timeout", error=error, notes=error)
        if result.exit_code != 0:
            error = f"the program exited with code {result.exit_code}; {said}"
            return Ending(exit_status="agent_error", error=error, notes=error)
        return Ending(exit_status="submitted", notes=f"exit code 0, {said}")

    def _values(self, run: AgentRun) -> dict[str, str]:
        assert run.time_limit_s is not None  # default_time_limit_s: never without one
        return {"instruction_file": INSTRUCTION_FILE, "instruction": run.task.instruction,
                "workdir": run.workdir, "model": run.model.model, "base_url": run.model.base_url or "",
                "bundle": self.spec.mount_point(), "entry": shlex.join(self.spec.entry_argv()),
                "scratch": SCRATCH, "timeout_s": str(max(1, math.floor(run.time_limit_s)))}

    def _environment(self, run: AgentRun, values: dict[str, str]) -> dict[str, str]:
        model = run.model
        if not model.base_url or model.api_key is None:
            raise InvalidRequest("the cli harness runs a program inside the sandbox and needs the gateway's URL and "
                                 "key there; run it through `orchard eval`, which gives them")
        key = model.api_key.get_secret_value()
        env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_BASE": model.base_url, "OPENAI_API_KEY": key,
               "OPENAI_MODEL": model.model}
        env.update(self.spec.entry_env())
        env.update({name: fill(value, values, quote=False) for name, value in self.env.items()})
        return env


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]
