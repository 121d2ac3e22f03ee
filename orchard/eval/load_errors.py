"""How a suite says that one of its tasks cannot run: the problem in the task's metadata under LOAD_ERROR_KEY.
Running such a task is an `environment_error` of that task alone (the trial never starts a sandbox for it),
and `orchard eval validate` lists it with the reason, so one broken task never blocks the rest of a suite."""

from __future__ import annotations

from orchard.core.task import Task

LOAD_ERROR_KEY = "orchard.load_error"  # Task.metadata: why the task cannot run (its trial is an error)


def unrunnable_task(task_id: str, problem: str, instruction: str = "") -> Task:
    """A stand-in for a task that could not be loaded: its id, and the problem that keeps it from running."""
    return Task(id=task_id, instruction=instruction or f"(not runnable: {problem})", metadata={LOAD_ERROR_KEY: problem})
