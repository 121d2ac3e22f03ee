"""The `kimi-cli` harness: the real Kimi-CLI (its pinned bundle) run inside the task's sandbox in print mode,
auto-approving, with the run's gateway as its OpenAI-compatible provider (config.py); its session logs
(`wire.jsonl`, `context.jsonl`) become the Trajectory (convert.py). Kimi is stopped a margin before the
evaluator's deadline (orchard/harnesses/in_sandbox/); once that stop fired, the rollout is the agent's
`timeout` even when its logs cannot be read in time."""

from __future__ import annotations

from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.trajectory import Trajectory
from orchard.harnesses.in_sandbox import AgentRun, Ending, Finished, InSandboxHarness, Launch, SandboxFile
from orchard.harnesses.kimi_cli.config import CONFIG_FILE, DEFAULT_CONTEXT_SIZE, MODEL_ALIAS, SHARE_DIR, config_toml
from orchard.harnesses.kimi_cli.convert import KimiSession, trajectory_from_session
from orchard.harnesses.kimi_cli.dialect import KimiCliDialect
from orchard.harnesses.mcp.install import MCP_CONFIG_PATH

DEFAULT_STEP_LIMIT = 100
STDERR_TAIL = 2000
MODEL_UNREACHABLE_EXIT = 75  # Kimi's "retryable" provider failure


class KimiCliHarness(InSandboxHarness):
    """Kimi-CLI 1.51.0 from its harness bundle, one print-mode turn per task."""

    name = "kimi-cli"
    version = "1.51.0"  # the bundle's pin (bundle.py)
    bundle = "kimi-cli"
    state_dir = SHARE_DIR
    time_limit_s = 3600.0
    mcp_tools = True  # its own MCP client, given the task's servers with --mcp-config-file

    def __init__(self, step_limit: int = DEFAULT_STEP_LIMIT, max_context_size: int = DEFAULT_CONTEXT_SIZE,
                 timeout_s: float | None = None) -> None:
        self.step_limit = step_limit
        self.max_context_size = max_context_size
        self.timeout_s = timeout_s

    def dialect(self) -> KimiCliDialect:
        """Kimi's tools, captured prompt and result framing, and the exact replay of its calls (dialect.py)."""
        return KimiCliDialect(self.name, self.version)

    async def launch(self, run: AgentRun, sandbox: Sandbox) -> Launch:
        """`kimi --print --output-format stream-json`, auto-approving, in the workdir, with the bundle's `bin/`
        (ripgrep, for its Grep tool) first on the task's own PATH. The prompt goes in on stdin (print mode reads
        it there when there is no `--prompt`), so no argument length limit applies to it."""
        mcp = ["--mcp-config-file", MCP_CONFIG_PATH] if run.task.environment.mcp_servers else []
        kimi = run.spec.entry_argv("--print", "--output-format", "stream-json", "--yolo", "--afk",
                                   "--config-file", CONFIG_FILE, "--model", MODEL_ALIAS, "--work-dir", run.workdir,
                                   *mcp)
        config = config_toml(run.model, max_context_size=self.max_context_size, max_steps=self.step_limit)
        return Launch(
            argv=["sh", "-c", 'PATH="$ORCHARD_KIMI_BIN:$PATH" exec "$@"', "kimi", *kimi],
            env={**run.spec.entry_env(), "KIMI_SHARE_DIR": SHARE_DIR,
                 "ORCHARD_KIMI_BIN": f"{run.spec.mount_point()}/bin",
                 "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200"},
            stdin=run.task.instruction,
            files=[SandboxFile(path=CONFIG_FILE, data=config.encode(), mode=0o600)])

    async def collect(self, run: AgentRun, sandbox: Sandbox, result: ExecResult) -> KimiSession:
        return await KimiSession.read(sandbox, SHARE_DIR)

    def convert(self, session: KimiSession | None, run: AgentRun, result: ExecResult) -> Trajectory:
        session = session if session is not None else KimiSession()
        trajectory = trajectory_from_session(session, agent=self.agent(run))
        trajectory.extra["native_logs"] = session.native_logs()
        trajectory.extra["kimi_exit_code"] = result.exit_code
        return trajectory

    def ending(self, run: AgentRun, finished: Finished, session: KimiSession | None,
               trajectory: Trajectory) -> Ending:
        """An error, with what Kimi printed and its stderr tail, unless it ended its turn or reached its own
        step limit (an attempt, graded); a clean exit that did not end its turn in the log is `stopped`."""
        result, session = finished.result, session if session is not None else KimiSession()
        tail = (result.stderr or "")[-STDERR_TAIL:].strip()
        said = f"; stderr: {tail}" if tail else ""
        printed = (result.stdout or "").strip().splitlines()[-1:]  # print mode prints its error as the last line
        if printed and not printed[0].startswith("{"):
            said = f"; it said: {printed[0][-STDERR_TAIL:]}{said}"
        if result.timed_out:
            error = f"kimi-cli ran past its time limit and was killed with its process group{said}"
            if finished.unread is not None:
                error = f"{error}; {finished.unread}"
            return Ending(exit_status="timeout", error=error, partial=True)
        if result.exit_code != 0 and session.max_steps_reached:
            return Ending(exit_status="step_limit")
        if session.model_failed is not None or result.exit_code == MODEL_UNREACHABLE_EXIT:
            return Ending(exit_status="model_error", partial=True, error=f"kimi-cli's model calls failed: "
                          f"{session.model_failed or 'the provider was unreachable'}{said}")
        if result.exit_code != 0:
            return Ending(exit_status="agent_error", error=f"kimi-cli exited with code {result.exit_code}{said}",
                          partial=True)
        if not session.model_called:
            return Ending(exit_status="agent_error", error=f"kimi-cli never called the model{said}", partial=True)
        return Ending(exit_status=trajectory.exit_status or "stopped")  # "submitted" when it ended its turn
