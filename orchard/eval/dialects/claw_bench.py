"""claw-bench's task directories (PyPI `claw-bench`):

    task/
      task.toml                 flat: id, title, domain, level, description, timeout, capabilities, ...
      instruction.md            "workspace/" in it means the workspace (rewritten to its absolute path)
      environment/setup.sh      makes the workspace's files; the workspace is $1 (environment/data/ beside it)
      solution/solve.sh         the reference solution; the workspace is $1
      verifier/test_output.py   pytest checks, run with --workspace=<workspace>

The score is the share of checks that pass, a reward in [0, 1]: a task is resolved at the suite's pass
threshold (1.0 by default, claw-bench's own verdict: no check fails). The image is the host's unless the
suite's suite.json names another (`"claw_bench_image"`). The workspace is the sandbox's /workspace; setup
runs from a copy of environment/ that is removed before the agent starts, and the verifier is placed only
when the agent is done. Some of claw-bench's scripts ignore $1 (and verifiers --workspace) and use
<task>/workspace: there it is the workspace too (a link).

A task whose own files are broken is not runnable, with the reason (found without running anything): a script
bash cannot parse (`bash -n`), or input data that setup.sh copies from environment/data/ and the task does not
have."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.task import ScriptGrader, Task, TaskEnvironment, TaskFile
from orchard.eval.dialects.common import (INSTRUCTION_MD, TASK_TOML, TaskDirError, dir_files, read_text, read_toml,
                                          unpack_command)
from orchard.eval.load_errors import LOAD_ERROR_KEY

DEFAULT_IMAGE = "host"  # Orchard's own Python, with pytest, first on its PATH
WORKSPACE = "/workspace"
SETUP_DIR = "/tmp/orchard-claw-task"  # environment/ for setup.sh, gone before the agent starts
VERIFIER_DIR = "/tmp/orchard-claw-verifier"
REWARD_FILE = f"{VERIFIER_DIR}/reward"
VERIFIER_TIMEOUT_S = 300.0
SCRIPTS = ("environment/setup.sh", "solution/solve.sh")
# a path setup.sh copies from: environment/data/<path>, up to a quote, a space, a glob or a variable
DATA_REFERENCE = re.compile(r"environment/data(/[^\s\"'*?$]*)?")
# The --workspace option and fixture that claw-bench's tasks/conftest.py gives every verifier.
CONFTEST = '''import pathlib

import pytest


def pytest_addoption(parser):
    parser.addoption("--workspace", action="store", default=None, help="the task's workspace")


@pytest.fixture
def workspace(request):
    return pathlib.Path(request.config.getoption("--workspace"))
'''
# checks passed / checks run, from pytest's JUnit XML; nothing printed when no check ran
SCORE = '''import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
count = lambda key: sum(int(suite.get(key, 0)) for suite in suites)
total = count("tests") - count("skipped")
if total > 0:
    print((total - count("failures") - count("errors")) / total)
'''


class ClawBenchTaskToml(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    id: str = Field(pattern=r"^[a-z]+-[0-9]{3}$")
    title: str = Field(min_length=1)
    domain: str = Field(min_length=1)
    level: str = Field(pattern=r"^L[1-4]$")
    description: str
    timeout: int = Field(ge=1)
    capabilities: list[str] = Field(min_length=1)
    skills_allowed: bool = True
    tags: list[str] = Field(default_factory=list)


def is_claw_bench_dir(directory: Path) -> bool:
    """claw-bench's layout: a verifier/ directory, or (to name the right dialect in an error) no tables."""
    if (directory / "verifier").is_dir():
        return True
    if (directory / "tests").is_dir():
        return False
    text = (directory / TASK_TOML).read_text(encoding="utf-8", errors="replace")
    return re.search(r"^\s*\[", text, flags=re.MULTILINE) is None


def defects(directory: Path) -> list[str]:
    """What keeps the task from running as written, found by reading its files: a script that bash cannot
    parse, a path under environment/data/ that setup.sh copies from and the task lacks (the data directory
    itself: missing or empty)."""
    found = [problem for part in SCRIPTS if (problem := _syntax_error(directory / part))]
    setup = (directory / "environment/setup.sh").read_text(encoding="utf-8", errors="replace")
    for reference in dict.fromkeys(_data_references(setup)):
        if not _has_data(directory, reference):
            named = _input_names(directory)
            found.append(f"its input data is missing: environment/setup.sh copies from {reference}, "
                         "which the task does not have"
                         f"{' (the instruction names ' + ', '.join(named) + ')' if named else ''}")
    return found


def _data_references(script: str) -> list[str]:
    """The paths under environment/data/ a script names; one cut off by a glob or a variable ends in `*`."""
    references = []
    for match in DATA_REFERENCE.finditer(script):
        cut = script[match.end():match.end() + 1] in ("$", "*", "?")
        references.append(match.group(0) + "*" if cut else match.group(0).rstrip("/"))
    return references


def _has_data(directory: Path, reference: str) -> bool:
    """Whether the task has what the reference names: the file, a non-empty directory, or for one ending in
    `*` an entry whose name starts with what precedes it."""
    if reference.endswith("*"):
        parent, _, prefix = reference[:-1].rpartition("/")
        source = directory / parent
        return source.is_dir() and any(entry.name.startswith(prefix) for entry in source.iterdir())
    source = directory / reference
    return source.is_file() or (source.is_dir() and any(source.iterdir()))


def _syntax_error(script: Path) -> str | None:
    stat = script.stat()
    return _bash_n(str(script), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4096)
def _bash_n(path: str, _mtime_ns: int, _size: int) -> str | None:
    """bash's complaint about the script, parsed and not run (`bash -n`); None when it parses (or there is no
    bash here to ask). Cached by the file's mtime and size: an installed suite is read once per process."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    checked = subprocess.run([bash, "-n", path], capture_output=True, text=True, timeout=30)
    if checked.returncode == 0:
        return None
    said = " ".join(line.replace(path + ": ", "", 1) for line in checked.stderr.strip().splitlines())
    return f"{Path(path).parent.name}/{Path(path).name} has a syntax error (bash -n): {said}"


def _input_names(directory: Path) -> list[str]:
    """The file names the instruction gives in backquotes that it does not name as an output (workspace/...)."""
    text = (directory / INSTRUCTION_MD).read_text(encoding="utf-8", errors="replace")
    outputs = set(re.findall(r"workspace/([\w.-]+)", text))
    names = re.findall(r"`([\w-]+\.[A-Za-z0-9]{1,5})`", text)
    return [name for name in dict.fromkeys(names) if name not in outputs]


def verifier_script() -> str:
    """pytest over the checks, then the score into REWARD_FILE, only when pytest ran them (exit 0: all passed, 1:
    some failed); a crash (a collection error, no checks) writes none: the grader's error."""
    return (f"cd {VERIFIER_DIR} && rm -f reward junit.xml && ln -sfn {WORKSPACE} workspace && "
            "python -m pytest -q -p no:cacheprovider --rootdir . --junitxml junit.xml verifier/test_output.py "
            f"--workspace={WORKSPACE}; status=$?; "
            f'if [ "$status" -le 1 ]; then python - junit.xml > reward <<\'ORCHARD_SCORE\'\n{SCORE}ORCHARD_SCORE\n'
            "fi; exit $status")


def claw_bench_task(directory: Path, image: str = DEFAULT_IMAGE) -> Task:
    """The task; `image` one with Python and pytest (`python` on its PATH), e.g. the host's or a Debian one."""
    config = read_toml(directory, ClawBenchTaskToml)
    instruction = re.sub(r"(?<![\w/.])workspace/", f"{WORKSPACE}/", read_text(directory, INSTRUCTION_MD))
    for part in ("environment/setup.sh", "solution/solve.sh", "verifier/test_output.py"):
        if not (directory / part).is_file():
            raise TaskDirError(f"task {directory.name}: {part} is missing")
    # <task>/workspace is the workspace too: some setup.sh, solve.sh and verifiers use it and ignore $1
    setup = [(f"ln -s {WORKSPACE} {SETUP_DIR}/workspace && bash {SETUP_DIR}/environment/setup.sh {WORKSPACE} && "
              f"rm -rf {SETUP_DIR}")]
    environment = TaskEnvironment(image=image, workdir=WORKSPACE, files=dir_files(directory / "environment",
                                                                                   f"{SETUP_DIR}/environment"),
                                  setup=setup)
    solve = (f'ln -s {WORKSPACE} "$ORCHARD_TASK_DIR/workspace" && cd {WORKSPACE} && '
             f'bash "$ORCHARD_TASK_DIR/solution/solve.sh" {WORKSPACE}')
    files = [*dir_files(directory / "verifier", f"{VERIFIER_DIR}/verifier"),
             TaskFile(path=f"{VERIFIER_DIR}/conftest.py", content=CONFTEST)]
    grader = ScriptGrader(script=verifier_script(), reward_file=REWARD_FILE, reward_required=True, files=files,
                          timeout_s=VERIFIER_TIMEOUT_S,
                          reference_solution=unpack_command(directory, ["environment", "solution"], solve))
    metadata = {"dialect": "claw-bench", "claw_bench": config.model_dump(exclude={"id"})}
    broken = defects(directory)
    if broken:  # the task as it reads, under its own id, and why it cannot run
        metadata[LOAD_ERROR_KEY] = f"task {config.id} ({directory.name}): " + "; ".join(broken)
    return Task(id=config.id, instruction=instruction, environment=environment, grader=grader,
                agent_timeout_s=float(config.timeout), metadata=metadata)
