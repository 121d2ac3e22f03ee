"""`zeroclaw`: the harness this distribution registers. Two ways to run it, chosen by its options:

- the **profile** (the default, and what runs everywhere): a Python harness in Orchard's process with
  ZeroClaw's tool names and argument schemas, its system-prompt layout, its history cap and its delegated
  sub-agents (profile/). Its version, `<this distribution>+zeroclaw-profile.<release>`, is what
  `orchard harness list` shows: the listing never names the real binary;
- the **real ZeroClaw** when a binary is given: `binary=PATH` (default `$ZEROCLAW_BIN`), a ZeroClaw executable
  on this machine that each sandbox gets a copy of, or `bundle=NAME`, a harness bundle whose entry command is
  ZeroClaw. Its gateway then runs inside the task's sandbox with its `custom` provider at the Orchard gateway,
  and the task goes over `/ws/chat` (real/). `binary=""` runs the profile even where `ZEROCLAW_BIN` is set.

Options (`orchard eval --harness-option KEY=VALUE`, `--max-steps N` for `step_limit`): the profile takes the
fields of `ProfileConfig` (profile/config.py); the real binary takes `step_limit`, `max_history_messages`,
`shell_timeout_s`, `autonomy` (its risk profile's level, `full` or `supervised`), `approval` (the answer to
its `approval_request` frames: `approve`, `always` or `deny`) and `timeout_s`. An option the chosen way does
not take is refused, naming it, before anything runs."""

from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError

from orchard.core.errors import InvalidRequest, describe_validation_errors
from orchard.core.harness import ModelConfig
from orchard.core.sandbox import Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Trajectory

from orchard_zeroclaw.dialect import ZeroClawDialect
from orchard_zeroclaw.profile.agent import Run
from orchard_zeroclaw.profile.config import ProfileConfig
from orchard_zeroclaw.version import PROFILE_VERSION

BINARY_ENV = "ZEROCLAW_BIN"
REAL_OPTIONS = frozenset({"step_limit", "max_history_messages", "shell_timeout_s", "approval", "autonomy", "timeout_s"})


class ZeroClawHarness:
    name = "zeroclaw"
    version = PROFILE_VERSION  # the profile's; a run of the real binary records the binary's (real/harness.py)
    mcp_tools = True  # the profile offers a task's MCP tools as `<server>__<tool>`; the binary gets them in its config
    bundle: str | None = None  # the profile runs in Orchard's process; the real binary from a harness bundle

    def __init__(self, config: ProfileConfig | dict[str, Any] | None = None, *, binary: str | None = None,
                 bundle: str | None = None, **options: Any) -> None:
        if binary is None:
            binary = os.environ.get(BINARY_ENV) or None
        self.config: ProfileConfig | None = None
        self.real = None
        if binary or bundle:
            if config is not None or not set(options) <= REAL_OPTIONS:
                given = sorted((set(options) - REAL_OPTIONS) | ({"config"} if config is not None else set()))
                raise InvalidRequest(f"the real ZeroClaw ({_which(binary, bundle)}) does not take the profile's "
                                     f"option(s) {', '.join(given)}; it takes {', '.join(sorted(REAL_OPTIONS))}")
            from orchard_zeroclaw.real.harness import RealZeroClaw

            self.real = RealZeroClaw(binary=binary or None, bundle=bundle, **options)
            self.bundle, self.version = self.real.bundle, self.real.version
            return
        wrong = sorted({"approval", "autonomy", "timeout_s"} & set(options))
        if wrong:
            raise InvalidRequest(f"the ZeroClaw profile does not take {', '.join(wrong)} (the real binary's options: "
                                 f"give binary=PATH or bundle=NAME, or set {BINARY_ENV}); use wall_time_limit_s for a "
                                 "time limit of the profile's own")
        base = config.model_dump() if isinstance(config, ProfileConfig) else dict(config or {})
        try:
            self.config = ProfileConfig.model_validate({**base, **options})
        except ValidationError as exc:
            raise InvalidRequest("invalid zeroclaw profile config: "
                                 f"{describe_validation_errors(exc, 'config')}") from None

    @property
    def runs_real_binary(self) -> bool:
        return self.real is not None

    def dialect(self) -> ZeroClawDialect:
        """ZeroClaw's tools as neutral actions and back, the profile's prompt and result framing, and the replay
        of its calls with the profile's tools (dialect.py). The real binary's trajectories use the same tools."""
        return ZeroClawDialect(self.config or ProfileConfig(), version=self.version)

    async def setup(self, task: Task, sandbox: Sandbox) -> None:
        """The real binary's harness-setup phase: its copy placed in the sandbox. The profile needs none."""
        if self.real is not None:
            await self.real.setup(task, sandbox)

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        if self.real is not None:
            return await self.real.run(task, sandbox, model)
        assert self.config is not None
        return await Run(self.name, self.version, self.config, task, sandbox, model).run()


def _which(binary: str | None, bundle: str | None) -> str:
    return f"binary {binary}" if binary else f"bundle {bundle}"
