"""The todo service: the user's task list. Its state:

    {"tasks": [{"id", "title", "due", "priority", "done", "notes", "tags": [...]}]}

`due` is a date (`YYYY-MM-DD`) or empty; priority is low, normal or high."""

from __future__ import annotations

from datetime import date

from .base import (Fields, SeedError, Service, action, bad, boolean, not_found, string, strings,
                                     unique_ids)

PRIORITIES = ("low", "normal", "high")
EDITABLE = {"title": string("what to do"), "due": string("due date, YYYY-MM-DD"),
            "priority": string("low, normal (default) or high"), "notes": string("details"), "tags": strings("tags")}


def due_date(text: str | None) -> str:
    if not text:
        return ""
    try:
        return date.fromisoformat(text[:10]).isoformat()
    except ValueError:
        raise bad(f"due must be a date like 2026-03-06, not {text!r}") from None


class Todo(Service):
    name = "todo"
    description = "The user's task list: add, change, complete and remove tasks."

    def state_from_seed(self, seed: dict) -> dict:
        f = Fields(seed, "todo seed", ("tasks",))
        tasks = []
        for index, raw in enumerate(f.items("tasks")):
            where = f"todo seed.tasks[{index}]"
            t = Fields(raw, where, ("id", "title", "due", "priority", "done", "notes", "tags"))
            priority = t.text("priority", "normal")
            if priority not in PRIORITIES:
                raise SeedError(f"{where}.priority must be one of {', '.join(PRIORITIES)}")
            try:
                due = due_date(t.text("due"))
            except Exception as exc:  # an ActionError: said as the seed's fault
                raise SeedError(f"{where}: {exc}") from None
            tasks.append({"id": t.required("id"), "title": t.required("title"), "due": due, "priority": priority,
                          "done": t.flag("done"), "notes": t.text("notes"), "tags": t.texts("tags")})
        unique_ids(tasks, "todo seed.tasks")
        return {"tasks": tasks}

    def _task(self, task_id: str) -> dict:
        for task in self.state["tasks"]:
            if task["id"] == task_id:
                return task
        raise not_found(f"no task {task_id!r} (list_tasks gives the ids)")

    def _fields(self, values: dict) -> dict:
        fields = {key: value for key, value in values.items() if value is not None}
        if "due" in fields:
            fields["due"] = due_date(fields["due"])
        if fields.get("priority", "normal") not in PRIORITIES:
            raise bad(f"priority must be one of {', '.join(PRIORITIES)}")
        return fields

    @action("List tasks (open ones unless include_done), by due date.",
            {"include_done": boolean("also completed tasks"), "tag": string("only tasks with this tag")},
            mutates=False)
    def list_tasks(self, include_done: bool = False, tag: str | None = None):
        found = [t for t in self.state["tasks"]
                 if (include_done or not t["done"]) and (tag is None or tag in t["tags"])]
        return {"tasks": sorted(found, key=lambda t: (t["due"] or "9999", t["id"]))}

    @action("Add a task.", EDITABLE, ("title",))
    def create_task(self, title: str, **values):
        task = {"id": self.new_id("t"), "title": title, "due": "", "priority": "normal", "done": False, "notes": "",
                "tags": []}
        task.update(self._fields(values))
        self.state["tasks"].append(task)
        return {"created": task}

    @action("Change a task's fields (those given).", {"task_id": string("the task"), **EDITABLE,
                                                      "done": boolean("completed or not")}, ("task_id",))
    def update_task(self, task_id: str, **values):
        task = self._task(task_id)
        fields = self._fields(values)
        if not fields:
            raise bad("update_task needs at least one field to change")
        task.update(fields)
        return {"updated": task}

    @action("Mark a task done.", {"task_id": string("the task")}, ("task_id",))
    def complete_task(self, task_id: str):
        task = self._task(task_id)
        task["done"] = True
        return {"completed": task}

    @action("Remove a task.", {"task_id": string("the task")}, ("task_id",))
    def delete_task(self, task_id: str):
        self.state["tasks"].remove(self._task(task_id))
        return {"deleted": task_id}
