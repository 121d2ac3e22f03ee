"""A task: the instruction an agent gets, the environment it works in, and how its work is graded.

Harnesses read `instruction` and `environment`; the grader spec and metadata are for the evaluator (a
SWE task's grader holds the tests and the reference patch, which the agent must never see)."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.core.sandbox import NetworkPolicy, SandboxSpec

SWEBENCH_WORKDIR = "/testbed"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskFile(_Strict):
    """A file placed in the sandbox before the agent starts."""

    path: str = Field(min_length=1, description="absolute, or relative to the environment's workdir")
    content: str
    encoding: Literal["utf-8", "base64"] = Field(default="utf-8", description="base64 for binary content")
    mode: int | None = Field(default=None, ge=0, le=0o7777, description="e.g. 0o755 for a script")

    @model_validator(mode="after")
    def _decodable(self) -> TaskFile:
        if self.encoding == "base64":
            try:
                base64.b64decode(self.content, validate=True)
            except binascii.Error as exc:
                raise ValueError(f"{self.path}: content is not valid base64: {exc}") from None
        return self

    def data(self) -> bytes:
        return base64.b64decode(self.content) if self.encoding == "base64" else self.content.encode()


MCP_DIR = "/tmp/.orchard-mcp"  # where a task's MCP tools are installed in its sandbox (harnesses/mcp/install.py)
MCP_CALL_PATH = f"{MCP_DIR}/mcp-call"  # the command that calls one of them (shell forms write McpCall with it)
NOOP_RESOLVES = "noop_resolves"  # metadata: the benchmark scores doing nothing as right (tau2's refusals)


class TaskService(_Strict):
    """A service the task runs inside the sandbox (a mail server, a calendar, an MCP server over HTTP),
    started before the agent under a user of its own that the agent cannot signal, and with state it
    cannot touch but through the service's own interface (docs/services.md)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$", description="also its environment variables' name")
    command: str = Field(min_length=1, description="a shell command line, run in the service's state directory")
    port: int | None = Field(default=None, ge=1, le=65535, description="where it listens; waited for")
    health_check: str | None = Field(default=None, pattern=r"^/\S*$", description="an HTTP path that answers 2xx "
                                     "once the service is ready (needs `port`)")
    ready_timeout_s: float = Field(default=30, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    seed_dir: str | None = Field(default=None, description="a directory in the sandbox (placed by the task's "
                                 "files or setup) copied into the service's state directory before it starts")
    user_model: Literal["optional", "required"] | None = Field(default=None, description=(
        "the service plays the task's user (docs/claw.md, multi-turn tasks): the evaluator hands it the run's "
        "--user-model through the gateway, recorded apart from the agent's calls; `optional`: it follows a "
        "script without one, `required`: a run without --user-model is refused"))

    @model_validator(mode="after")
    def _health_check_needs_a_port(self) -> TaskService:
        if self.health_check is not None and self.port is None:
            raise ValueError(f"service {self.name}: a health_check needs the port it is asked on")
        return self

    @property
    def env_prefix(self) -> str:
        """`ORCHARD_SERVICE_<NAME>`: its URL (`_URL`) and state directory (`_STATE`) are named so."""
        return "ORCHARD_SERVICE_" + self.name.upper().replace("-", "_")


class TaskMCPServer(_Strict):
    """An MCP server the task provides inside the sandbox, whose tools every harness that takes MCP tools
    offers the model (docs/tools-mcp.md). `http`: streamable HTTP, started like a service (its own user,
    waited for on `port`) and reached at http://127.0.0.1:<port><path>; `stdio`: a command line each client
    starts for itself inside the sandbox."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,30}$", description="prefixes its tools' names")
    command: str = Field(min_length=1, description="a shell command line")
    transport: Literal["http", "stdio"] = "http"
    port: int | None = Field(default=None, ge=1, le=65535, description="http: where it listens")
    path: str = Field(default="/mcp", pattern=r"^/")
    env: dict[str, str] = Field(default_factory=dict)
    ready_timeout_s: float = Field(default=30, gt=0)

    @model_validator(mode="after")
    def _http_needs_a_port(self) -> TaskMCPServer:
        if (self.transport == "http") != (self.port is not None):
            raise ValueError(f"MCP server {self.name}: an http server needs a port, a stdio one has none")
        return self

    @property
    def service(self) -> TaskService | None:
        """The service an http server runs as (named `mcp-<name>`); None for stdio."""
        if self.transport != "http":
            return None
        return TaskService(name=f"mcp-{self.name}", command=self.command, port=self.port, env=self.env,
                           ready_timeout_s=self.ready_timeout_s)

    def client_config(self) -> dict[str, Any]:
        """This server in the `mcpServers` shape MCP clients take (kimi-cli, OpenHands, Claude's): a url
        with its transport, or a command with its arguments (and environment)."""
        if self.transport == "http":
            return {"url": f"http://127.0.0.1:{self.port}{self.path}", "transport": "http"}
        return {"command": "/bin/sh", "args": ["-c", self.command], **({"env": self.env} if self.env else {})}


class TaskEnvironment(_Strict):
    """Where the agent works: the sandbox image and what is done in it before the agent starts (files
    placed first, then `setup` commands run in order in `workdir`; a failing command fails the task's
    setup, which is an error, not a failed attempt)."""

    image: str = Field(default="host", description="backend image reference (see SandboxSpec.image)")
    workdir: str = "/workspace"
    env: dict[str, str] = Field(default_factory=dict)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    files: list[TaskFile] = Field(default_factory=list)
    setup: list[str] = Field(default_factory=list, description="shell commands")
    setup_timeout_s: float = Field(default=600, gt=0, description="per setup command")
    services: list[TaskService] = Field(default_factory=list, description="started after setup, in parallel")
    mcp_servers: list[TaskMCPServer] = Field(default_factory=list, description="the task's tools over MCP")

    @model_validator(mode="after")
    def _unique_names(self) -> TaskEnvironment:
        for what, names in (("service", [s.name for s in self.all_services]),
                            ("MCP server", [m.name for m in self.mcp_servers])):
            if len(set(names)) != len(names):
                raise ValueError(f"{what} names must be unique: {', '.join(sorted(names))}")
        by_port: dict[int, str] = {}
        for service in self.all_services:
            if service.port is not None and by_port.setdefault(service.port, service.name) != service.name:
                raise ValueError(f"services {by_port[service.port]} and {service.name} both listen on port "
                                 f"{service.port}; give each its own")
        return self

    @property
    def all_services(self) -> list[TaskService]:
        """The services to start: the task's own, then its http MCP servers."""
        return self.services + [m.service for m in self.mcp_servers if m.service is not None]

    def sandbox_spec(self, **overrides: Any) -> SandboxSpec:
        """The SandboxSpec for this environment; `overrides` (cpu, memory_mb, timeout_s, ...) win."""
        fields = {"image": self.image, "workdir": self.workdir, "env": dict(self.env),
                  "network": self.network.model_copy(), "services": bool(self.all_services)}
        fields.update(overrides)
        return SandboxSpec(**fields)


class SWETestsGrader(_Strict):
    """SWE-bench style: apply `test_patch` to the agent's working tree, run the tests; resolved when every
    FAIL_TO_PASS test passes and every PASS_TO_PASS test still does."""

    kind: Literal["swe_tests"] = "swe_tests"
    repo: str
    version: str = Field(description="selects the test command for repos whose command depends on it")
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str] = Field(default_factory=list)
    test_command: str | None = Field(default=None, description="None: the evaluator's default for repo+version")
    reference_patch: str | None = Field(default=None, description="the gold patch, to validate the pipeline")
    timeout_s: float = Field(default=1800, gt=0)


class ScriptGrader(_Strict):
    """Run `script` (shell) in the sandbox after the agent finishes: resolved when it exits 0. The reward is
    the number in `reward_file` (a path in the sandbox) when given, else 1.0 if resolved and 0.0 if not.
    `files` are placed only then (a verifier's tests, which the agent must never see); `reference_solution`
    is a shell command that solves the task (what the oracle plays and `orchard eval validate` checks)."""

    kind: Literal["script"] = "script"
    script: str = Field(min_length=1)
    reward_file: str | None = None
    reward_required: bool = Field(default=False, description="a verifier that writes no readable reward is the "
                                                             "grader's error, not the agent's failed attempt")
    files: list[TaskFile] = Field(default_factory=list, description="placed just before the script runs")
    reference_solution: str | None = None
    timeout_s: float = Field(default=600, gt=0)


class RubricJudge(_Strict):
    """An LLM judge of the agent's final answer (Claw-Eval's judge_rubric; orchard/eval/rubric_judge.py): the
    model, named as the run's gateway knows it, answers a score in [0, 1] for the rubric; that score is
    `weight` of the task's completion, the script's deterministic checks the rest."""

    model: str = Field(min_length=1)
    rubric: str = Field(min_length=1)
    weight: float = Field(default=0.5, gt=0, le=1)


class ServicesGrader(_Strict):
    """Run `script` (shell) after the agent stops as the services' user, where their state directories are
    readable (`$ORCHARD_SERVICE_<NAME>_STATE`) and their ports reachable (`$ORCHARD_SERVICE_<NAME>_URL`, e.g.
    a mock service's `/audit` action log). Resolved when it exits 0; with `reward: "stdout"` the reward is
    the number on the last line it prints (resolved at the pass threshold). No file is read: anything the
    agent could have written is never taken as a verdict."""

    kind: Literal["services"] = "services"
    script: str = Field(min_length=1)
    reward: Literal["exit_code", "stdout"] = "exit_code"
    timeout_s: float = Field(default=600, gt=0)
    reference_solution: str | None = Field(default=None, description="a shell command that solves the task (what "
                                           "the oracle plays and `orchard eval validate` checks)")
    final_text: bool = Field(default=False, description="the agent's final answer (its last message's text) is "
                             "given to the script as $ORCHARD_FINAL_TEXT (graders that read what the agent said)")
    judge: RubricJudge | None = Field(default=None, description="an LLM judge scores the final answer against a "
                                      "rubric after the script (reward: \"stdout\" with a claw-score line)")


GraderSpec = Annotated[SWETestsGrader | ScriptGrader | ServicesGrader, Field(discriminator="kind")]


class SWEBenchInstance(BaseModel):
    """One SWE-bench instance, as the dataset has it. FAIL_TO_PASS / PASS_TO_PASS are lists; the JSON-string
    encoding the dataset uses is accepted too. Fields of dataset variants (e.g. Verified's `difficulty`)
    are kept."""

    model_config = ConfigDict(extra="allow")

    repo: str
    instance_id: str = Field(min_length=1)
    base_commit: str
    patch: str = ""
    test_patch: str
    problem_statement: str
    hints_text: str = ""
    version: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    environment_setup_commit: str | None = None
    created_at: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_string_list(cls, value: Any, info) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError(f"{info.field_name} is a string but not a JSON list: {value[:80]!r}") from None
        return value

    @field_validator("created_at", mode="before")
    @classmethod
    def _timestamp_text(cls, value: Any) -> Any:
        return value.isoformat() if isinstance(value, datetime) else value

    @property
    def image(self) -> str:
        """The official SWE-bench evaluation image (Docker Hub forbids `__`, SWE-bench writes `_1776_`)."""
        return f"swebench/sweb.eval.x86_64.{self.instance_id.replace('__', '_1776_').lower()}:latest"


class Task(_Strict):
    id: str = Field(min_length=1)
    instruction: str
    environment: TaskEnvironment = Field(default_factory=TaskEnvironment)
    grader: GraderSpec | None = Field(default=None, description="None: not graded (e.g. data collection)")
    agent_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                          description="the task's own limit on the agent's run (Harbor's [agent] "
                                          "timeout_sec); the run's limit (`agent_s`) applies too, the lower wins")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _printable_id(cls, value: str) -> str:
        if value != value.strip() or any(ch.isspace() for ch in value):
            raise ValueError(f"task id {value!r} must not contain whitespace")
        return value

    @classmethod
    def from_swebench(cls, instance: SWEBenchInstance | dict[str, Any], *, image: str | None = None,
                      include_hints: bool = False) -> Task:
        """A task from a SWE-bench instance, run in its official image (or `image`) at /testbed, where the
        repository is checked out at `base_commit`. Hints are left out by default, as SWE-bench does."""
        inst = instance if isinstance(instance, SWEBenchInstance) else SWEBenchInstance.model_validate(instance)
        instruction = inst.problem_statement
        if include_hints and inst.hints_text.strip():
            instruction += f"\n\nHints:\n{inst.hints_text}"
        grader = SWETestsGrader(repo=inst.repo, version=inst.version, test_patch=inst.test_patch,
                                fail_to_pass=inst.FAIL_TO_PASS, pass_to_pass=inst.PASS_TO_PASS,
                                reference_patch=inst.patch or None)
        # The record minus what the grader holds: patches must not reach the agent through metadata.
        record = inst.model_dump(exclude={"patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"})
        return cls(id=inst.instance_id, instruction=instruction,
                   environment=TaskEnvironment(image=image or inst.image, workdir=SWEBENCH_WORKDIR),
                   grader=grader, metadata={"swebench": record})
