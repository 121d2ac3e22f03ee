"""The `cli` harness's command template: `{name}` placeholders, each replaced by a value that is
shell-quoted where it lands in the command (as-is in environment values).

A placeholder is `{` + an identifier + `}` not preceded by `$`, so the shell's own `${VAR}`, brace
expansion (`{a,b}`, `{1..3}`) and awk programs (`'{print $1}'`) pass through untouched. An identifier that
is not a known placeholder is refused when the harness is created, before anything runs."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from orchard.core.errors import InvalidRequest

PLACEHOLDERS: dict[str, str] = {
    "instruction_file": "a file holding the task's instruction (outside the workdir)",
    "instruction": "the task's instruction itself",
    "workdir": "the task's working directory (the command also starts there)",
    "model": "the model's name as the gateway serves it (for litellm-based agents: openai/{model})",
    "base_url": "the rollout's OpenAI-compatible base URL (also in OPENAI_BASE_URL)",
    "bundle": "the harness bundle's mount point, /.orchard/harness/<name>",
    "entry": "the bundle's own command (its spec's `entry`), e.g. the venv's `mini`",
    "scratch": "a writable directory outside the workdir for the program's own files and logs",
    "timeout_s": "whole seconds the program has before it is killed",
}
_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def placeholders_in(template: str) -> list[str]:
    """The placeholders `template` names, in order of first use."""
    return list(dict.fromkeys(match.group(1) for match in _PLACEHOLDER.finditer(template)))


def check_template(template: str, what: str) -> None:
    """Refuse `template` when it names a placeholder there is no value for."""
    unknown = [name for name in placeholders_in(template) if name not in PLACEHOLDERS]
    if unknown:
        names = ", ".join("{" + name + "}" for name in unknown)
        known = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
        raise InvalidRequest(f"the cli harness's {what} names unknown placeholder(s) {names}; the known ones are "
                             f"{known} (a shell variable is written ${{NAME}}, which is left alone)")


def fill(template: str, values: Mapping[str, str], *, quote: bool) -> str:
    """`template` with every placeholder replaced by its value, shell-quoted when `quote`."""
    def value(match: re.Match[str]) -> str:
        text = values[match.group(1)]
        return shlex.quote(text) if quote else text

    return _PLACEHOLDER.sub(value, template)
