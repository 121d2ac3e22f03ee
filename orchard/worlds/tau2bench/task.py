"""A tau2-bench task (an entry of a domain's tasks.json) as an Orchard `Task` (docs/claw.md, "tau2-bench
airline"):

- the instruction is the domain's policy document, then a few lines saying the agent's role, how to reach the
  customer and the reservation system (Orchard's Task has no separate system context: the policy comes first);
- the environment runs two services: the domain's database (service.py, tau2's own tools, port 8131) and the
  Claw world's `user` (the customer: the persona from the task's user scenario for a user model, a script for
  runs without one), each with its tools over MCP;
- the grader replays the gold actions on a fresh database in the sandbox and compares hashes, and checks what
  the agent told the customer (grade.py); reward 1 or 0, resolved at 1;
- the reference solution (the oracle's) greets the customer, replays the gold actions through the tools
  (`mcp-call`) and tells the customer the task's communicate_info.

tasks.json is read strictly: a task missing a field, a gold action naming no tool of the domain or a reward
basis Orchard cannot grade is a Tau2TaskError naming the task and the field. Runs on the host (pydantic)."""

from __future__ import annotations

import compileall
import functools
import json
import shlex
import textwrap
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.core.errors import describe_validation_errors
from orchard.core.task import (NOOP_RESOLVES, ServicesGrader, Task, TaskEnvironment, TaskFile, TaskMCPServer,
                                TaskService)
from orchard.worlds.claw.services import PORTS
from orchard.worlds.claw.task import SEED_ROOT, compiled, python, world_command
from orchard.worlds.tau2bench.domain import tool_names, write_tools

RUN_PY = Path(__file__).resolve().parent / "run.py"
DOMAIN_PORT = 8131  # beside the Claw world's 8101-8106 and 8125
USER_PORT = PORTS["user"]
DOMAIN_SEED_DIR = "/tmp/.tau2/seed"
MCP_CALL = "/tmp/.orchard-mcp/mcp-call"
GRADED_BASIS = ("DB", "COMMUNICATE")
GREETING = "Hello, thank you for contacting us. How can I help you today?"
CLOSING = "Thank you, that is all I needed. ###STOP###"


class Tau2TaskError(ValueError):
    """A tau2-bench task Orchard cannot run: the message names the task and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")  # tau2's descriptive fields (annotations, ...) are not needed


class Instructions(_Model):
    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str


class UserScenario(_Model):
    persona: str | None = None
    instructions: Instructions | str


class GoldAction(_Model):
    action_id: str
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    requestor: Literal["assistant", "user"] | None = None


class Criteria(_Model):
    actions: list[GoldAction] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    env_assertions: list[dict[str, Any]] | None = None
    reward_basis: list[Literal["DB", "ENV_ASSERTION", "NL_ASSERTION", "ACTION", "COMMUNICATE"]] = Field(
        default_factory=lambda: ["DB", "COMMUNICATE"])  # tau2's default


class Tau2Task(_Model):
    id: str = Field(min_length=1)
    user_scenario: UserScenario
    initial_state: dict[str, Any] | None = None
    evaluation_criteria: Criteria


def read_task(raw: Any, domain: str, index: int) -> Tau2Task:
    """One entry of tasks.json, checked: what tau2 would run, and only what Orchard can grade."""
    name = f"#{index}" + (f" (id {raw['id']})" if isinstance(raw, dict) and isinstance(raw.get("id"), str) else "")
    if not isinstance(raw, dict):
        raise Tau2TaskError(f"tau2 task {name}: must be a JSON object, not {type(raw).__name__}")
    try:
        task = Tau2Task.model_validate(raw)
    except ValidationError as exc:
        raise Tau2TaskError(f"tau2 task {name}: {describe_validation_errors(exc, limit=1)}") from None
    where = f"tau2 task {task.id}"
    if task.initial_state:
        raise Tau2TaskError(f"{where}: initial_state: a task that starts from its own state (initialization data or "
                            "actions, an earlier conversation) is not supported yet; the domain's database is the "
                            "package's as it is")
    tools = tool_names(domain)
    for i, action in enumerate(task.evaluation_criteria.actions or []):
        if action.name not in tools:
            raise Tau2TaskError(f"{where}: evaluation_criteria.actions[{i}].name: {action.name!r} is no tool of the "
                                f"{domain} domain (its tools: {', '.join(tools)})")
        if action.requestor == "user":
            raise Tau2TaskError(f"{where}: evaluation_criteria.actions[{i}].requestor: the {domain} domain has no "
                                "user tools")
    ungraded = [part for part in task.evaluation_criteria.reward_basis if part not in GRADED_BASIS]
    if ungraded:
        raise Tau2TaskError(f"{where}: evaluation_criteria.reward_basis: {', '.join(ungraded)} is not graded by "
                            f"Orchard (only {', '.join(GRADED_BASIS)}; NL_ASSERTION would need a judge model)")
    return task


def persona(scenario: UserScenario) -> str:
    """What the user model is told to be, as tau2 gives its user simulator the scenario."""
    parts = [scenario.persona.strip()] if scenario.persona else []
    instructions = scenario.instructions
    if isinstance(instructions, str):
        parts.append(instructions)
    else:
        fields = [("Domain", instructions.domain), ("Reason for call", instructions.reason_for_call),
                  ("Known info", instructions.known_info), ("Unknown info", instructions.unknown_info),
                  ("Task instructions", instructions.task_instructions)]
        parts.append("\n".join(f"{label}:\n{textwrap.indent(value.strip(), '    ')}"
                               for label, value in fields if value is not None))
    return "\n\n".join(parts)


def opening(scenario: UserScenario) -> str:
    """The scripted customer's first message (runs without a user model: the oracle, tests)."""
    instructions = scenario.instructions
    if isinstance(instructions, str):
        return instructions.strip()
    known = f"\n{instructions.known_info.strip()}" if instructions.known_info else ""
    return f"Hi, I'm calling about this: {instructions.reason_for_call.strip()}{known}"


def instruction(policy: str, domain: str) -> str:
    return (f"{policy.rstrip()}\n\n---\n\nYou are the {domain} customer service agent and follow the policy above. "
            "A customer is waiting: you talk to them only through the `user` tool message_user (your message in, "
            "their reply out); your first message greets them and gets their request. You act on the reservation "
            f"system through the `{domain}` tools. The same actions are HTTP APIs at "
            f"${'ORCHARD_SERVICE_' + domain.upper() + '_URL'} and $ORCHARD_SERVICE_USER_URL. The conversation "
            "is over when the customer ends it (`done`).\n")


def reference_solution(task: Tau2Task, domain: str) -> str:
    """The oracle's shell command: greet, replay the gold actions through the tools (a gold action that fails is
    gone on from, as tau2's replay does), tell the customer the communicate_info."""
    def call(service: str, tool: str, arguments: dict) -> str:
        return f"{MCP_CALL} {service} {tool} {shlex.quote(json.dumps(arguments))}"

    lines = [call("user", "message_user", {"text": GREETING})]
    lines += [call(domain, action.name, action.arguments) for action in task.evaluation_criteria.actions or []]
    info = task.evaluation_criteria.communicate_info or []
    final = f"Here is what you asked about: {'; '.join(info)}." if info else "Your request is taken care of."
    lines.append(call("user", "message_user", {"text": final}))
    return "\n".join(lines) + "\n"


@functools.cache
def compiled_here() -> bool:
    """This package byte-compiled beside its sources, once per process (the sandbox sees it read-only)."""
    return compileall.compile_dir(str(RUN_PY.parent), quiet=2, workers=1)


def tau2_task(raw: Any, *, domain: str, policy: str, index: int = 0) -> Task:
    """The Orchard Task of one tasks.json entry; a Tau2TaskError naming the task and field if it cannot run."""
    task = read_task(raw, domain, index)
    compiled()  # the Claw world's modules, byte-compiled for the user service and the MCP proxies
    compiled_here()
    criteria = task.evaluation_criteria
    domain_seed_dir, user_seed_dir = f"{DOMAIN_SEED_DIR}/{domain}", f"{SEED_ROOT}/user"
    user_seed = {"persona": persona(task.user_scenario),
                 "script": [{"reply": opening(task.user_scenario)}, {"reply": CLOSING}], "stop": "###STOP###"}
    files = [TaskFile(path=f"{domain_seed_dir}/seed.json", content=json.dumps({"domain": domain})),
             TaskFile(path=f"{user_seed_dir}/seed.json", content=json.dumps(user_seed, indent=1))]
    serve_domain = " ".join(["exec", shlex.quote(python()), "-I", shlex.quote(str(RUN_PY)), "serve",
                             "--port", str(DOMAIN_PORT)])
    services = [TaskService(name=domain, command=serve_domain, port=DOMAIN_PORT, health_check="/health",
                            ready_timeout_s=60, seed_dir=domain_seed_dir),
                TaskService(name="user", command=world_command("serve", "user", "--port", str(USER_PORT)),
                            port=USER_PORT, health_check="/health", seed_dir=user_seed_dir, user_model="optional")]
    tools = [TaskMCPServer(name=name, transport="stdio",
                           command=world_command("mcp", name, f"http://127.0.0.1:{port}"))
             for name, port in ((domain, DOMAIN_PORT), ("user", USER_PORT))]
    graded = {"domain": domain, "task_id": task.id, "service": domain, "user_service": "user",
              "reward_basis": list(criteria.reward_basis),
              "actions": [{"name": a.name, "arguments": a.arguments, "requestor": a.requestor or "assistant"}
                          for a in criteria.actions or []],
              "communicate_info": criteria.communicate_info or []}
    grade = (f"{shlex.quote(python())} -I {shlex.quote(str(RUN_PY))} grade <<'TAU2_CRITERIA'\n"
             f"{json.dumps(graded)}\nTAU2_CRITERIA\n")
    info = {"domain": domain, "task_id": task.id, "reward_basis": list(criteria.reward_basis),
            "gold_actions": len(criteria.actions or []), "communicate_info": len(criteria.communicate_info or []),
            "not_graded": {"nl_assertions": len(criteria.nl_assertions or [])},
            # nothing to change and nothing to tell: doing nothing is the right outcome (a no-op resolves it)
            "noop_resolves": (not any(a.name in write_tools(domain) for a in criteria.actions or [])
                              and not ("COMMUNICATE" in criteria.reward_basis and criteria.communicate_info))}
    return Task(id=f"{domain}-{task.id}", instruction=instruction(policy, domain),
                environment=TaskEnvironment(image="host", workdir="/workspace", files=files, services=services,
                                            mcp_servers=tools),
                grader=ServicesGrader(script=grade, reward="stdout", timeout_s=300,
                                      reference_solution=reference_solution(task, domain)),
                metadata={"dialect": "tau2", "tau2": info, NOOP_RESOLVES: info["noop_resolves"]})
