"""The ReAct harness's default prompts and how templates are filled.

Templates use `string.Template` (`$instruction`, `$workdir`, `$task_id`; `$$` for a literal dollar) so
code and JSON in a prompt need no escaping."""

from __future__ import annotations

from string import Template

TEMPLATE_VARIABLES = ("instruction", "workdir", "task_id")

DEFAULT_SYSTEM_TEMPLATE = """\
You are a software engineering agent working in a Linux sandbox. You act only through the tools you are \
given; each call's result comes back to you before your next step.

- `bash` runs a shell command in the repository ($workdir); each call starts a fresh shell.
- `view` shows a file with line numbers (or a directory listing); `view_range` picks lines.
- `create` writes a whole file; `str_replace` replaces one exact, unique piece of text in a file.
- `submit` ends the task: call it once your change is complete and tested.

Work step by step: find the relevant code, reproduce the problem, fix it with the smallest sensible \
change, run the tests, then submit. Do not modify the tests unless the task asks you to."""

DEFAULT_INSTANCE_TEMPLATE = """\
Solve the following task in the repository at $workdir.

<task>
$instruction
</task>

When the change is complete and tested, call `submit`."""


def check_template(template: str) -> None:
    """Raise ValueError when a template uses a placeholder the harness does not fill, or a bad `$`."""
    try:
        Template(template).substitute({name: "" for name in TEMPLATE_VARIABLES})
    except KeyError as exc:
        raise ValueError(f"unknown placeholder ${exc.args[0]}; templates can use "
                         f"{', '.join('$' + name for name in TEMPLATE_VARIABLES)} (write $$ for a dollar sign)"
                         ) from None
    except ValueError as exc:
        raise ValueError(f"{exc}; write $$ for a literal dollar sign") from None


def render(template: str, *, instruction: str, workdir: str, task_id: str) -> str:
    return Template(template).substitute(instruction=instruction, workdir=workdir, task_id=task_id)
