"""Harbor's task directories (also Terminal-Bench 2's):

    task/
      task.toml         [metadata], [verifier] timeout_sec/env, [agent] timeout_sec,
                        [environment] docker_image/allow_internet/..., [solution] env
      instruction.md    what the agent is asked
      environment/      Dockerfile (or a prebuilt image named in task.toml) and its context
      tests/test.sh     the verifier, run from /tests; writes /logs/verifier/reward.txt (a number) or
                        reward.json ({"reward": x})
      solution/solve.sh the reference solution (the oracle's)

The tests are placed at /tests only when the agent is done; the verifier must write a reward (a missing or
garbled one is a grader error naming the task). Without `docker_image` the image is built from
environment/Dockerfile before the run (orchard/eval/image_build/). The agent works in `[environment]
workdir`, else the Dockerfile's last WORKDIR, else /app."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.sandbox import NetworkPolicy
from orchard.core.task import ScriptGrader, Task, TaskEnvironment
from orchard.eval.dialects.common import INSTRUCTION_MD, TaskDirError, dir_files, read_text, read_toml, unpack_command
from orchard.eval.image_build.dockerfile import last_workdir
from orchard.eval.image_build.spec import BUILD_KEY, image_build

TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
SOLUTION_DIR = "/solution"
DEFAULT_WORKDIR = "/app"
REWARD_COPY = "/tmp/orchard-verifier-reward"  # whichever of reward.txt / reward.json the verifier wrote
DOCKERFILE = "environment/Dockerfile"


class _Table(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class HarborVerifier(_Table):
    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class HarborAgent(_Table):
    timeout_sec: float = Field(default=600.0, gt=0)


class HarborEnvironment(_Table):
    docker_image: str | None = Field(default=None, min_length=1)
    build_timeout_sec: float = Field(default=600.0, gt=0)
    allow_internet: bool = False
    workdir: str = Field(default=DEFAULT_WORKDIR, pattern=r"^/")
    env: dict[str, str] = Field(default_factory=dict)


class HarborSolution(_Table):
    env: dict[str, str] = Field(default_factory=dict)


class HarborTaskToml(_Table):
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: HarborVerifier = Field(default_factory=HarborVerifier)
    agent: HarborAgent = Field(default_factory=HarborAgent)
    environment: HarborEnvironment = Field(default_factory=HarborEnvironment)
    solution: HarborSolution = Field(default_factory=HarborSolution)


def _exports(env: dict[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}; " for name, value in env.items())


def verifier_script(config: HarborTaskToml) -> str:
    """Run tests/test.sh from /tests as Harbor does; a reward left by anyone before it ran does not count."""
    logs, reward = VERIFIER_LOGS, REWARD_COPY
    return (f"rm -f {logs}/reward.txt {logs}/reward.json {reward}; mkdir -p {logs} /logs/agent; "
            f"{_exports(config.verifier.env)}cd {TESTS_DIR} && bash test.sh; status=$?; "
            f"if [ -f {logs}/reward.txt ]; then cp {logs}/reward.txt {reward}; "
            f"elif [ -f {logs}/reward.json ]; then cp {logs}/reward.json {reward}; fi; exit $status")


def harbor_task(directory: Path) -> Task:
    config = read_toml(directory, HarborTaskToml)
    instruction = read_text(directory, INSTRUCTION_MD)
    if not (directory / "tests" / "test.sh").is_file():
        raise TaskDirError(f"task {directory.name}: tests/test.sh is missing (Harbor's verifier)")
    if not (directory / "solution" / "solve.sh").is_file():
        raise TaskDirError(f"task {directory.name}: solution/solve.sh is missing (the reference solution)")
    environment = config.environment
    image, workdir, metadata = environment.docker_image, environment.workdir, {}
    if image is None:  # built from environment/Dockerfile before the run (orchard/eval/image_build/)
        dockerfile = read_text(directory, DOCKERFILE) if (directory / DOCKERFILE).is_file() else None
        if dockerfile is None:
            raise TaskDirError(f"task {directory.name}: task.toml names no [environment] docker_image and "
                               f"{DOCKERFILE} is missing")
        build = image_build(directory.name, dockerfile, directory / "environment")
        image, metadata = build.image, {BUILD_KEY: build.model_dump()}
        if "workdir" not in environment.model_fields_set:
            workdir = last_workdir(dockerfile) or workdir
    solve = (f"mkdir -p {SOLUTION_DIR} && cp -R \"$ORCHARD_TASK_DIR/solution/.\" {SOLUTION_DIR}/ && cd "
             f"{shlex.quote(workdir)} && {_exports(config.solution.env)}bash {SOLUTION_DIR}/solve.sh")
    grader = ScriptGrader(script=verifier_script(config), reward_file=REWARD_COPY, reward_required=True,
                          files=dir_files(directory / "tests", TESTS_DIR), timeout_s=config.verifier.timeout_sec,
                          reference_solution=unpack_command(directory, ["solution"], solve))
    network = NetworkPolicy(mode="open" if environment.allow_internet else "none")
    return Task(id=directory.name, instruction=instruction,
                environment=TaskEnvironment(image=image, workdir=workdir, env=dict(environment.env), network=network),
                grader=grader, agent_timeout_s=config.agent.timeout_sec,
                metadata={"dialect": "harbor", "harbor": config.metadata, **metadata})
