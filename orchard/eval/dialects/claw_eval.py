"""Claw-Eval's tasks (docs/claw.md, "Claw-Eval tasks"), in either form:

    T07_todo/                        a Claw-Eval task directory
      task.yaml                      services, prompt, tools + tool_endpoints, scoring (claw_eval_spec.py)
      solution/solve.sh              (optional, Orchard's) the reference solution the oracle plays
    ce-T046-cve-research/task.json   a task as clawbench-eval bundles it: the task.yaml verbatim in
                                     judge_context.source_task_yaml

Made into an Orchard Task:
- each service is a TaskService: its command run in the Claw-Eval checkout's root (the `mock_services/` its
  command names), ready on its port and health check's path; its `reset_endpoint` is recorded only (every
  trial gets a fresh sandbox, so nothing needs resetting). The root is `services_dir` (`--claw-eval-services
  DIR`, $ORCHARD_CLAW_EVAL_SERVICES), else the task directory, else the directory two levels up (a task at
  <checkout>/tasks/<id>/). What the commands name there (their script's top directory, paths in their env)
  is placed in the sandbox at /tmp/.claw-eval, never the task.yaml (its scoring) nor solution/;
- the tools are MCP tools, one stdio server per service (`run.py mcp-endpoints`), each call POSTed to its
  tool's endpoint;
- the grader reads each service's `/audit` and the agent's final text (`run.py grade-claw-eval`); a
  judge_rubric is scored by the judge model (`--judge-model`, $ORCHARD_JUDGE_MODEL) through the gateway.

A task that cannot run here is loaded with the reason (LOAD_ERROR_KEY), not dropped: a service whose command
is not in any root (clawbench-eval ships the tasks, not the services), a service that needs the internet
(web_real: live search and fetch), a judge_rubric without a judge model."""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from orchard.core.errors import describe_validation_errors
from orchard.core.sandbox import NetworkPolicy
from orchard.core.task import (RubricJudge, ServicesGrader, Task, TaskEnvironment, TaskFile, TaskMCPServer,
                               TaskService)
from orchard.eval.dialects.claw_eval_spec import JUDGE_CHECK, ClawEvalTaskSpec, Service
from orchard.eval.dialects.common import TaskDirError, dir_files, read_text, unpack_command
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.worlds.claw.endpoints import encode_tools
from orchard.worlds.claw.task import compiled, world_command

TASK_YAML = "task.yaml"
TASK_JSON = "task.json"
SOURCE_KEY = "source_task_yaml"  # clawbench-eval's task.json: judge_context.source_task_yaml
SOLVE_SH = "solution/solve.sh"
SERVICES_ENV = "ORCHARD_CLAW_EVAL_SERVICES"
JUDGE_ENV = "ORCHARD_JUDGE_MODEL"
SANDBOX_ROOT = "/tmp/.claw-eval"
PASS_THRESHOLD = 0.75  # Claw-Eval's
MAX_PLACED_BYTES = 32 << 20
# Claw-Eval's services that search and fetch the live web: they need the internet, so they cannot run offline.
LIVE_WEB_SERVICES = ("web_real", "web_real_injection")
IGNORED = {"__pycache__", ".git", ".pytest_cache"}


def is_claw_eval_dir(directory: Path) -> bool:
    if (directory / TASK_YAML).is_file():
        return True
    path = directory / TASK_JSON
    try:
        return path.is_file() and f'"{SOURCE_KEY}"'.encode() in path.read_bytes()
    except OSError:
        return False


def read_spec(directory: Path) -> tuple[ClawEvalTaskSpec, str]:
    """The task's spec and the file it came from; a TaskDirError naming the file and the field."""
    if (directory / TASK_YAML).is_file():
        where, text = TASK_YAML, read_text(directory, TASK_YAML)
    else:
        where = f"{TASK_JSON} (judge_context.{SOURCE_KEY})"
        try:
            bundled = json.loads(read_text(directory, TASK_JSON))
        except ValueError as exc:
            raise TaskDirError(f"task {directory.name}: {TASK_JSON} is not JSON: {exc}") from None
        text = (bundled.get("judge_context") or {}).get(SOURCE_KEY) if isinstance(bundled, dict) else None
        if not isinstance(text, str):
            raise TaskDirError(f"task {directory.name}: {TASK_JSON} has no judge_context.{SOURCE_KEY} text (the "
                               "Claw-Eval task.yaml clawbench-eval bundles)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise TaskDirError(f"task {directory.name}: {where} is not valid YAML: {at}{problem}") from None
    if not isinstance(data, dict):
        raise TaskDirError(f"task {directory.name}: {where} must be a mapping of keys (task_id, prompt, tools, ...), "
                           f"not {type(data).__name__}")
    try:
        return ClawEvalTaskSpec.model_validate(data), where
    except ValidationError as exc:
        raise TaskDirError(f"task {directory.name}: {where}: {_described(exc)}") from None


def _described(exc: ValidationError) -> str:
    """pydantic's first error, its field's path first (a whole-task check names its own field)."""
    text = describe_validation_errors(exc, default="", limit=1).replace("Value error, ", "")
    return text[2:] if text.startswith(": ") else text


def _script(command: str) -> str | None:
    """The relative path of the program a service's command runs (`python mock_services/x/server.py`)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for word in words[1:] if words and "python" in posixpath.basename(words[0]) else words:
        if not word.startswith("-") and ("/" in word or word.endswith(".py")) and not posixpath.isabs(word):
            return posixpath.normpath(word)
    return None


def _roots(directory: Path, services_dir: Path | None) -> list[Path]:
    roots = [services_dir] if services_dir else []
    return roots + [directory, directory.parent.parent]


def services_root(spec: ClawEvalTaskSpec, directory: Path, services_dir: Path | None) -> tuple[Path | None, list[str]]:
    """The root every service's command is found in, or (None, what is missing)."""
    scripts = [(service, _script(service.command)) for service in spec.services]
    for root in _roots(directory, services_dir):
        if all(script is None or (root / script).is_file() for _, script in scripts):
            return root, []
    missing = [f"service {service.name}: its command `{service.command}` runs {script}, which is not "
               f"here" for service, script in scripts if script is not None]
    return None, missing


def _placed(spec: ClawEvalTaskSpec, root: Path, directory: Path) -> list[TaskFile]:
    """What the services' commands name below the root, at SANDBOX_ROOT: each script's top directory and each
    relative path in their env (fixtures), never the task's own task.yaml or solution."""
    names: set[str] = set()
    for service in spec.services:
        script = _script(service.command)
        if script is not None:
            names.add(script.split("/", 1)[0] if "/" in script else script)
        for value in service.env.values():
            if value and not posixpath.isabs(value) and (root / value).exists() and ".." not in value.split("/"):
                names.add(posixpath.normpath(value))
    files: list[TaskFile] = []
    for name in sorted(names):
        path = root / name
        if path.is_dir():
            files += [f for f in dir_files(path, posixpath.join(SANDBOX_ROOT, name))
                      if not set(Path(f.path).parts) & IGNORED]
        elif path.is_file():
            files += [f for f in dir_files(path.parent, posixpath.join(SANDBOX_ROOT, posixpath.dirname(name)))
                      if posixpath.basename(f.path) == path.name]
    hidden = {directory / TASK_YAML, directory / TASK_JSON}
    files = [f for f in files if root / Path(f.path).relative_to(SANDBOX_ROOT) not in hidden
             and not Path(f.path).relative_to(SANDBOX_ROOT).as_posix().startswith("solution/")]
    size = sum(len(f.content) for f in files)
    if size > MAX_PLACED_BYTES:
        raise TaskDirError(f"task {directory.name}: the services' files under {root} are {size >> 20} MiB, more than "
                           f"{MAX_PLACED_BYTES >> 20} MiB to place in every sandbox")
    return files


def _task_service(service: Service) -> TaskService:
    health = urlsplit(service.health_check).path or "/" if service.health_check else None
    if service.health_check_method.upper() != "GET":
        health = None  # Orchard asks a health check with GET: the port alone says it is up
    command = f"cd {shlex.quote(SANDBOX_ROOT)} && exec {service.command}"
    return TaskService(name=service.name.lower(), command=command, port=service.port, health_check=health,
                       ready_timeout_s=service.ready_timeout, env={"PORT": str(service.port), **service.env})


def _mcp_servers(spec: ClawEvalTaskSpec) -> list[TaskMCPServer]:
    by_service: dict[str, list[dict[str, Any]]] = {}
    tools = {tool.name: tool for tool in spec.tools}
    for endpoint in spec.tool_endpoints:
        tool = tools[endpoint.tool_name]
        by_service.setdefault(spec.service_of(endpoint).name.lower(), []).append(
            {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema,
             "url": endpoint.url, "method": endpoint.method})
    compiled()
    return [TaskMCPServer(name=name[:31], transport="stdio", command=world_command("mcp-endpoints", name,
                                                                                      encode_tools(entries)))
            for name, entries in by_service.items()]


def grading(spec: ClawEvalTaskSpec) -> dict[str, Any]:
    """What the in-sandbox grader (orchard/worlds/claw/eval_grade.py) reads: the audits, each tool's endpoint
    path, the components and the safety checks."""
    used = {spec.service_of(endpoint).name for endpoint in spec.tool_endpoints}
    return {"audits": {s.name: s.audit_url() for s in spec.services if s.name in used},
            "tools": {e.tool_name: {"path": urlsplit(e.url).path} for e in spec.tool_endpoints},
            "components": [{"name": c.name, "weight": c.weight, "check": c.check.model_dump(exclude_none=True)}
                           for c in spec.scoring_components if c.check.type != JUDGE_CHECK],
            "safety": [{"tool_name": s.tool_name, "description": s.description} for s in spec.safety_checks]}


def grade_script(spec: ClawEvalTaskSpec) -> str:
    return (f"{world_command('grade-claw-eval')[len('exec '):]} <<'CLAW_EVAL_SCORING'\n"
            f"{json.dumps(grading(spec))}\nCLAW_EVAL_SCORING\n")


def claw_eval_task(directory: Path, *, services_dir: Path | None = None, judge_model: str | None = None) -> Task:
    """The Task of a Claw-Eval task directory; `services_dir` and `judge_model` default to their environment
    variables. A task that cannot run here carries the reasons (LOAD_ERROR_KEY)."""
    spec, where = read_spec(directory)
    services_dir = services_dir or (Path(os.environ[SERVICES_ENV]) if os.environ.get(SERVICES_ENV) else None)
    judge_model = judge_model or os.environ.get(JUDGE_ENV) or None
    if services_dir is not None and not services_dir.is_dir():
        raise TaskDirError(f"task {directory.name}: the Claw-Eval services directory {services_dir} does not exist")
    problems: list[str] = []
    root, missing = services_root(spec, directory, services_dir)
    live = [s.name for s in spec.services if s.name in LIVE_WEB_SERVICES]
    if root is None:
        problems.append("; ".join(missing) + " (clawbench-eval ships the task, not Claw-Eval's mock services: pass "
                        "--claw-eval-services DIR, a Claw-Eval checkout holding mock_services/)")
        if live:  # with the services given it runs, its sandbox's network open
            problems.append(f"{', '.join(live)} searches and fetches the live web, so it needs the internet")
    if spec.needs_judge and not judge_model:
        problems.append("its score has a judge_rubric part, which only an LLM judge can give: pass --judge-model "
                        "NAME")
    unserved = spec.unserved_tools()
    if unserved:
        problems.append(f"tool {', '.join(unserved)} has no entry in tool_endpoints (the URL it calls) and is not "
                        "a shell the harness provides")
    if getattr(spec, "user_agent", None):
        problems.append("its user_agent (a simulated user, several turns) is not imported")
    files = _placed(spec, root, directory) if root is not None else []
    reference = None
    if (directory / SOLVE_SH).is_file():
        reference = unpack_command(directory, ["solution"], f'sh "$ORCHARD_TASK_DIR/{SOLVE_SH}"')
    judge = (RubricJudge(model=judge_model, rubric=spec.judge_rubric_text(), weight=spec.judge_weight())
             if spec.needs_judge and judge_model else None)
    grader = ServicesGrader(script=grade_script(spec), reward="stdout", timeout_s=120, final_text=True, judge=judge,
                            reference_solution=reference)
    info = {"task_name": spec.task_name, "category": spec.category, "difficulty": spec.difficulty,
            "tags": spec.tags, "source": where, "services": [s.name for s in spec.services],
            "reset_endpoints": {s.name: s.reset_endpoint for s in spec.services if s.reset_endpoint},
            "tools": [t.name for t in spec.tools], "needs_judge": spec.needs_judge, "judge_model": judge_model,
            "needs_internet": bool(live), "max_turns": spec.environment.max_turns,
            "scoring_components": [c.name for c in spec.scoring_components]}
    # Not kept: the reference_solution (prose naming the steps) and the rubric — harnesses see the metadata.
    metadata: dict[str, Any] = {"dialect": "claw-eval", "claw_eval": info}
    if problems:
        metadata[LOAD_ERROR_KEY] = f"task {spec.task_id}: not runnable here: " + "; ".join(problems)
    try:
        return Task(id=spec.task_id, instruction=spec.prompt.text,
                    environment=TaskEnvironment(image="host", workdir="/workspace", files=files,
                                                services=[_task_service(s) for s in spec.services],
                                                mcp_servers=_mcp_servers(spec),
                                                network=NetworkPolicy(mode="open" if live else "none")),
                    grader=grader, agent_timeout_s=spec.environment.timeout_seconds, metadata=metadata)
    except (ValidationError, ValueError) as exc:
        detail = describe_validation_errors(exc, limit=1) if isinstance(exc, ValidationError) else exc
        raise TaskDirError(f"task {directory.name}: {where}: {detail}") from None
