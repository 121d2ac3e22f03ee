"""The suite's tasks: small script-graded tasks, one per scenario, run together in one evaluation. The
conformance model (model.py) reads which scenario a rollout plays from the task's metadata."""

from __future__ import annotations

from orchard.core.task import ScriptGrader, Task, TaskEnvironment
from orchard.core.task_suite import TaskSuite

SCENARIO_KEY = "harness_conformance"
SOLVE = "solve"  # a shell command that writes a file, then submit: resolved by the grader
DEADLINE = "deadline"  # a command that outlasts the deadline, again and again: the harness must stop itself
MODEL_ERROR = "model_error"  # every model call fails (the gateway answers 502): an error, not an attempt
SCENARIOS = (SOLVE, DEADLINE, MODEL_ERROR)

WORKDIR = "/workspace"
SOLVE_COMMAND = f"cd {WORKDIR} && echo hello > hello.txt && cat hello.txt"
STALL_COMMAND = "sleep 600"

INSTRUCTIONS = {
    SOLVE: "Write the word hello, followed by a newline, into the file hello.txt in the working directory, "
           "then say that you are done.",
    DEADLINE: "Wait until the file signal.txt appears in the working directory, then say that you are done.",
    MODEL_ERROR: "Say hello.",
}
GRADERS = {SOLVE: "grep -qx hello hello.txt", DEADLINE: "test -e signal.txt", MODEL_ERROR: "true"}


def task_id(scenario: str) -> str:
    return f"harness-conformance-{scenario.replace('_', '-')}"


def conformance_suite(image: str = "host") -> TaskSuite:
    """One task per scenario, in a sandbox of `image` (a POSIX shell with `echo`, `cat`, `grep` and `sleep`)."""
    return TaskSuite(name="harness-conformance", tasks=[
        Task(id=task_id(scenario), instruction=INSTRUCTIONS[scenario],
             environment=TaskEnvironment(image=image, workdir=WORKDIR),
             grader=ScriptGrader(script=GRADERS[scenario], timeout_s=60), metadata={SCENARIO_KEY: scenario})
        for scenario in SCENARIOS])
