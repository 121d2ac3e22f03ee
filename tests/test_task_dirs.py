"""Task-directory suites (orchard/eval/dialects/): Harbor's and claw-bench's task directories read as they are,
eval/task-dirs-mini as the example. Loading (each dialect's task.toml, a bad one a task that cannot run named
with the part), grading in real local sandboxes (claw-bench's checks passed / total, Harbor's reward.json,
a verifier that crashes or writes garbage: a grader error naming the task), `orchard eval validate` (the
reference solution resolves every task, a no-op none), a run that keeps going past a broken task, images
built from a Dockerfile (daemon-less on the local backend, `docker build` on Docker), and docs/suites.md's
examples."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.errors import GraderError, InvalidRequest
from orchard.core.task import ScriptGrader, ServicesGrader, Task
from orchard.eval.dialects import load_task_dir
from orchard.eval.grading import _reward_of, grade_script
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.eval.models import eval_gateway_config
from orchard.eval.runner import run_eval
from orchard.eval.suites import available_suites, load_suite
from orchard.eval.task_sandbox import create_task_sandbox
from orchard.eval.validation import validate_suite
from orchard.sandbox.client import AsyncOrchard
from tests import doc_blocks
from tests.debian_image import import_debian
from tests.running_server import live_sandbox_ids

SUITE = Path(__file__).resolve().parents[1] / "eval" / "task-dirs-mini"
CLAW, HARBOR = "claw-sales-summary", "harbor-hello"
cli = CliRunner()


@pytest.fixture
def suite_copy(tmp_path) -> Path:
    copy = tmp_path / "suite"
    shutil.copytree(SUITE, copy)
    return copy


@pytest.fixture(scope="module")
def debian_home(module_home) -> Path:
    """The module's home, with the Debian image the Harbor task names."""
    import_debian(module_home)
    return module_home


# --- loading ---------------------------------------------------------------------------------------

def test_every_dialect_loads_from_the_example_suite_by_name():
    assert available_suites()["task-dirs-mini"] == SUITE
    suite = load_suite("task-dirs-mini")
    by_id = {task.id: task for task in suite.tasks}
    assert list(by_id) == ["mini-001", "mini-003", "harbor-build", HARBOR, "mail-service", "notes-mcp"]
    claw, harbor = by_id["mini-001"], by_id[HARBOR]
    assert not any(LOAD_ERROR_KEY in task.metadata for task in suite.tasks)
    # claw-bench: the host image, the workspace as /workspace, "workspace/" in the instruction rewritten
    assert (claw.environment.image, claw.environment.workdir) == ("host", "/workspace")
    assert "`/workspace/sales.csv`" in claw.instruction and "`workspace/" not in claw.instruction
    assert claw.environment.setup == [("ln -s /workspace /tmp/orchard-claw-task/workspace && "
                                       "bash /tmp/orchard-claw-task/environment/setup.sh /workspace && "
                                       "rm -rf /tmp/orchard-claw-task")]
    # Harbor: the prebuilt image of task.toml, its workdir; the tests at /tests, placed only for grading
    assert (harbor.environment.image, harbor.environment.workdir) == ("debian:bookworm-slim", "/app")
    assert harbor.agent_timeout_s == 300.0  # [agent] timeout_sec: the evaluator's limit on the agent
    assert claw.agent_timeout_s == float(tomllib.loads((SUITE / "claw-sales-summary" / "task.toml").read_text())
                                         ["timeout"])  # claw-bench's flat timeout: the same
    for task in (claw, harbor, by_id["mini-003"], by_id["harbor-build"]):
        grader = task.grader
        assert isinstance(grader, ScriptGrader) and grader.reward_required and grader.reference_solution
        placed = [file.path for file in task.environment.files]
        assert not [path for path in placed if "verifier" in path or "tests" in path or "solution" in path]
    assert [f.path for f in harbor.grader.files] == ["/tests/test.sh"] and harbor.grader.files[0].mode & 0o111
    assert "/tmp/orchard-claw-verifier/verifier/test_output.py" in [f.path for f in claw.grader.files]
    # Orchard's own: task.json with its files/ placed at their paths, solve.sh as the reference solution
    mail, notes = by_id["mail-service"], by_id["notes-mcp"]
    assert [f.path for f in mail.environment.files] == ["/tmp/mail/check.py", "/tmp/mail/mail.py"]
    assert [s.name for s in mail.environment.services] == ["mail"]
    assert [m.name for m in notes.environment.mcp_servers] == ["notes"]
    for task in (mail, notes):
        assert isinstance(task.grader, ServicesGrader) and "solution/solve.sh" in task.grader.reference_solution
        assert task.instruction.startswith(("A mail service", "Keep a note"))


def _rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("task_dir, old, new, problem", [
    (CLAW, "timeout = 300\n", "", "task claw-sales-summary: task.toml: timeout: Field required"),
    (CLAW, "timeout = 300", 'timeout = "300"',
     "task claw-sales-summary: task.toml: timeout: Input should be a valid integer"),
    (CLAW, 'id = "mini-001"', 'id = "Mini 1"', "task claw-sales-summary: task.toml: id: String should match pattern"),
    (HARBOR, "timeout_sec = 120.0", 'timeout_sec = "2 minutes"',
     "task harbor-hello: task.toml: verifier.timeout_sec: Input should be a valid number"),
    (HARBOR, "[agent]", "[agent", "task harbor-hello: task.toml cannot be read: "),
    (HARBOR, 'docker_image = "debian:bookworm-slim"', 'docker_image = ""',
     "task harbor-hello: task.toml: environment.docker_image: String should have at least 1 character"),
])
def test_a_bad_task_toml_is_a_task_that_cannot_run_naming_it_and_the_part(suite_copy, task_dir, old, new, problem):
    _rewrite(suite_copy / task_dir / "task.toml", old, new)
    suite = load_suite(suite_copy)
    broken = [task for task in suite.tasks if LOAD_ERROR_KEY in task.metadata]
    assert [task.id for task in broken] == [task_dir]  # named after its directory; the other task loads
    assert broken[0].metadata[LOAD_ERROR_KEY].startswith(problem), broken[0].metadata[LOAD_ERROR_KEY]
    assert "\n" not in broken[0].metadata[LOAD_ERROR_KEY]


@pytest.mark.parametrize("task_dir, part", [(CLAW, "verifier/test_output.py"), (HARBOR, "tests/test.sh"),
                                            (HARBOR, "solution/solve.sh"), (CLAW, "instruction.md")])
def test_a_missing_part_is_named(suite_copy, task_dir, part):
    (suite_copy / task_dir / part).unlink()
    task = load_task_dir(suite_copy / task_dir)
    assert task.metadata[LOAD_ERROR_KEY] == f"task {task_dir}: {part} is missing" or \
        task.metadata[LOAD_ERROR_KEY].startswith(f"task {task_dir}: {part} is missing")


def test_a_harbor_task_with_neither_an_image_nor_a_dockerfile_is_named(suite_copy):
    _rewrite(suite_copy / HARBOR / "task.toml", 'docker_image = "debian:bookworm-slim"\n', "")
    (suite_copy / HARBOR / "environment" / "Dockerfile").unlink()
    assert load_task_dir(suite_copy / HARBOR).metadata[LOAD_ERROR_KEY] == (
        "task harbor-hello: task.toml names no [environment] docker_image and environment/Dockerfile is missing")


def test_a_directory_of_neither_kind_says_what_a_suite_holds(tmp_path):
    (tmp_path / "suite" / "not-a-task").mkdir(parents=True)
    with pytest.raises(InvalidRequest, match=r"is not a task suite: tasks.jsonl is missing \(one task per line\), and "
                                             r"it holds no task directories either \(each with a task.toml"):
        load_suite(tmp_path / "suite")


def test_two_task_dirs_with_one_id_are_told_apart(suite_copy):
    shutil.copytree(suite_copy / CLAW, suite_copy / "claw-copy")
    tasks = load_suite(suite_copy).tasks
    # directories by name: claw-copy, claw-sales-summary, ...: the second with the id is named after its directory
    assert [task.id for task in tasks][:2] == ["mini-001", CLAW]
    assert "its id 'mini-001' is also the id of claw-copy" in tasks[1].metadata[LOAD_ERROR_KEY]


@pytest.mark.parametrize("text, reward", [("1", 1.0), ("0.25\n", 0.25), ('{"reward": 0.5}', 0.5), ("0.75", 0.75),
                                          ('{"reward": "1"}', None), ('{"score": 1}', None), ("[1]", None),
                                          ("yes", None), ("", None), ('{"reward": true}', None)])
def test_a_reward_is_a_number_or_harbors_reward_json(text, reward):
    assert _reward_of(text) == reward


# --- grading in sandboxes ----------------------------------------------------------------------------

async def _grade(home: Path, task: Task, work: str | None, threshold: float = 1.0):
    async with AsyncOrchard(home=home) as orch:
        sandbox = await create_task_sandbox(orch, task)
        try:
            if work:
                assert (await sandbox.exec(work, cwd=task.environment.workdir)).exit_code == 0
            return await grade_script(sandbox, task, pass_threshold=threshold)
        finally:
            await sandbox.close()


PARTIAL = """printf '{"total": 685.75, "count": 6, "best_region": "south"}' > summary.json"""


@pytest.mark.slow
async def test_claw_bench_scores_checks_passed_over_total(embedded_home):
    task = load_task_dir(SUITE / CLAW)
    partial = await _grade(embedded_home, task, PARTIAL)
    assert (partial.reward, partial.resolved) == (0.75, False)  # 3 of 4 checks: not claw-bench's pass
    assert partial.details["pass_threshold"] == 1.0 and partial.details["reward_file"] == "read"
    assert (await _grade(embedded_home, task, PARTIAL, threshold=0.75)).resolved
    assert (await _grade(embedded_home, task, None)).reward == 0.0  # a no-op: every check fails
    # what the agent left as the reward beforehand does not count: the verifier writes its own
    cheat = "mkdir -p /tmp/orchard-claw-verifier && echo 1 > /tmp/orchard-claw-verifier/reward"
    assert (await _grade(embedded_home, task, cheat)).reward == 0.0


@pytest.mark.slow
async def test_a_verifier_that_crashes_is_a_grader_error_naming_the_task(embedded_home, suite_copy):
    (suite_copy / CLAW / "verifier" / "test_output.py").write_text("import no_such_module_here\n")
    task = load_task_dir(suite_copy / CLAW)
    with pytest.raises(GraderError, match=r"^task mini-001: the verifier's reward file "
                                          r"/tmp/orchard-claw-verifier/reward is missing: .*exited 2.*no_such_module"):
        await _grade(embedded_home, task, None)
    assert not await live_sandbox_ids(embedded_home)


@pytest.mark.slow
async def test_harbor_reads_reward_json_and_garbage_is_a_grader_error(debian_home, monkeypatch, suite_copy):
    monkeypatch.setenv("ORCHARD_HOME", str(debian_home))
    task = load_task_dir(suite_copy / HARBOR)
    solved = await _grade(debian_home, task, task.grader.reference_solution)
    assert (solved.reward, solved.resolved) == (1.0, True)
    _rewrite(suite_copy / HARBOR / "tests" / "test.sh", """printf '{"reward": %s}\\n' "$reward\"""",
             "echo 'all good!'")
    garbled = load_task_dir(suite_copy / HARBOR)
    with pytest.raises(GraderError, match=r"^task harbor-hello: the verifier's reward file .* is not a number: "
                                          r"'all good!'"):
        await _grade(debian_home, garbled, None)


# --- validate and run --------------------------------------------------------------------------------

@pytest.mark.slow
async def test_validate_the_example_suite_every_solution_resolves_and_no_op_fails(debian_home, monkeypatch):
    monkeypatch.setenv("ORCHARD_HOME", str(debian_home))
    checks = await validate_suite("task-dirs-mini", backend="local")
    ids = ["mini-001", "mini-003", "harbor-build", HARBOR, "mail-service", "notes-mcp"]
    assert [(c.task_id, c.valid, c.gold_resolved, c.empty_resolved) for c in checks] == [
        (task_id, True, True, False) for task_id in ids], [c.problems for c in checks]
    assert [(c.gold_reward, c.empty_reward) for c in checks] == [(1.0, 0.0)] * len(ids)
    assert not await live_sandbox_ids(debian_home)


@pytest.mark.slow
async def test_claw_bench_tasks_run_on_the_image_suite_json_names(debian_home, monkeypatch, suite_copy):
    monkeypatch.setenv("ORCHARD_HOME", str(debian_home))
    (suite_copy / "suite.json").write_text('{"name": "on-debian", "claw_bench_image": "debian:bookworm"}')
    assert load_suite(suite_copy).tasks[0].environment.image == "debian:bookworm"
    (check,) = await validate_suite(suite_copy, ["mini-001"], backend="local")
    assert (check.valid, check.gold_reward, check.empty_reward) == (True, 1.0, 0.0), check.problems
    (suite_copy / "suite.json").write_text('{"claw_bench_image": ""}')
    with pytest.raises(InvalidRequest, match="suite.json: claw_bench_image must be an image name, got ''"):
        load_suite(suite_copy)


@pytest.mark.slow
def test_validate_cli_lists_a_wrong_solution_and_a_broken_task(embedded_home, suite_copy):
    shutil.copytree(suite_copy / CLAW, suite_copy / "claw-wrong")
    _rewrite(suite_copy / "claw-wrong" / "task.toml", 'id = "mini-001"', 'id = "mini-002"')
    _rewrite(suite_copy / "claw-wrong" / "solution" / "solve.sh", "max(by_region", "min(by_region")
    _rewrite(suite_copy / HARBOR / "task.toml", "timeout_sec = 120.0", "timeout_sec = -1")
    done = cli.invoke(app, ["eval", "validate", "--suite", str(suite_copy), "--backend", "local"])
    assert done.exit_code == 1, done.output
    lines = [" ".join(line.split()) for line in done.output.splitlines()]
    assert "mini-002: the reference solution does not resolve it: reward 0.75 (the pass threshold is 1); the " \
           "verifier said:" in "\n".join(lines)
    assert "harbor-hello: task harbor-hello: task.toml: verifier.timeout_sec: Input should be greater than 0" in lines
    assert "7 task(s), 2 invalid" in lines


@pytest.mark.slow
async def test_a_run_goes_on_past_a_task_that_cannot_run_and_a_verifier_that_crashes(embedded_home, suite_copy,
                                                                                      tmp_path):
    (suite_copy / HARBOR / "tests" / "test.sh").unlink()
    shutil.copytree(suite_copy / CLAW, suite_copy / "claw-crash")
    _rewrite(suite_copy / "claw-crash" / "task.toml", 'id = "mini-001"', 'id = "mini-002"')
    (suite_copy / "claw-crash" / "verifier" / "test_output.py").write_text("def test_(:\n")
    results = await run_eval(harness="react", model="oracle", suite=suite_copy, out_dir=tmp_path / "run",
                             gateway_config=eval_gateway_config("oracle"), backend="local")
    by_id = {row.task_id: row for row in results.tasks}
    assert by_id["mini-001"].status == "resolved"
    assert (by_id["mini-002"].status, by_id["mini-002"].exit_status) == ("error", "grader_error")
    assert "task mini-002: the verifier's reward file /tmp/orchard-claw-verifier/reward is missing" in \
        by_id["mini-002"].error
    assert by_id[HARBOR].exit_status == "environment_error"
    assert by_id[HARBOR].error.endswith("task harbor-hello: tests/test.sh is missing (Harbor's verifier)")
    assert not await live_sandbox_ids(embedded_home)


# --- images built from environment/Dockerfile --------------------------------------------------------

DOCKERFILE = """FROM debian:bookworm-slim
ARG WORD=Hello
ENV GREETING=${WORD} \\
    LANG=C.UTF-8
WORKDIR /app
COPY files/note.txt ./
RUN echo "$GREETING from RUN in $(pwd)" > built.txt && \\
    mkdir -p /opt/tool && cp note.txt /opt/tool/
CMD ["bash"]
"""
# the built image's file system, environment and workdir, checked by the task's own verifier
BUILT_CHECKS = """[ "$(cat /app/built.txt)" = "Hello from RUN in /app" ] && \\
  [ "$(cat /opt/tool/note.txt)" = "noted" ] && [ "$GREETING" = Hello ] && [ "$LANG" = C.UTF-8 ] && \\
  [ -x /app/greet.sh ] || { echo 0 > /logs/verifier/reward.txt; exit 0; }
"""


def _dockerfile_task(suite: Path, name: str, dockerfile: str) -> Path:
    task = suite / name
    shutil.copytree(SUITE / HARBOR, task)
    _rewrite(task / "task.toml", 'docker_image = "debian:bookworm-slim"\nworkdir = "/app"\n', "")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "environment" / "files").mkdir()
    (task / "environment" / "files" / "note.txt").write_text("noted\n")
    test = task / "tests" / "test.sh"
    test.write_text(test.read_text().replace("checks=0 passed=0\n", "checks=0 passed=0\n" + BUILT_CHECKS))
    return task


@pytest.mark.slow
async def test_a_dockerfile_is_built_without_a_daemon_once_and_what_it_cannot_build_is_named(debian_home, tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setenv("ORCHARD_HOME", str(debian_home))
    suite = tmp_path / "built"
    suite.mkdir()
    _dockerfile_task(suite, "built", DOCKERFILE)
    _dockerfile_task(suite, "from-elsewhere", DOCKERFILE.replace("debian:bookworm-slim", "alpine:3.20"))
    _dockerfile_task(suite, "adds", DOCKERFILE.replace("COPY files/note.txt", "ADD files/note.txt"))
    _dockerfile_task(suite, "fails", DOCKERFILE.replace("mkdir -p /opt/tool", "false"))
    built = load_task_dir(suite / "built")
    assert built.environment.image.startswith("orchard-build/built:") and built.environment.workdir == "/app"
    checks = {check.task_id: check for check in await validate_suite(suite, backend="local")}
    assert (checks["built"].valid, checks["built"].gold_reward, checks["built"].empty_reward) == (True, 1.0, 0.0), \
        checks["built"].problems
    assert checks["from-elsewhere"].problems == [(
        "task from-elsewhere: its image cannot be built from environment/Dockerfile: its base image alpine:3.20 is not "
        "in the local image store (import it: `orchard image import ARCHIVE --name alpine:3.20`)")]
    assert checks["adds"].problems == [(
        "task adds: its image cannot be built from environment/Dockerfile: line 6: ADD is not supported by the local "
        "builder (it builds FROM, RUN, WORKDIR, ENV, COPY, ARG and USER root)")]
    (problem,) = checks["fails"].problems
    assert problem.startswith("task fails: its image cannot be built from environment/Dockerfile: line 7: RUN echo")
    assert "failed with exit code 1" in problem
    # the image is cached by the content hash of the Dockerfile and its context: not built again
    from orchard.sandbox.images import ImageStore
    record = ImageStore(debian_home / "images").resolve(built.environment.image)
    again = await validate_suite(suite, ["built"], backend="local")
    assert again[0].valid and ImageStore(debian_home / "images").resolve(built.environment.image) == record
    assert not await live_sandbox_ids(debian_home)


@pytest.mark.docker
async def test_on_the_docker_backend_the_dockerfile_is_built_by_docker_build(tmp_path, short_tmp, monkeypatch):
    """The daemon's own Debian test image tagged as the task's base (it has no registry to pull from): `docker
    build` of the task's Dockerfile (ADD included, which only the local builder refuses), then validated there."""
    from tests.docker_daemon import TEST_IMAGE, require_daemon
    docker = pytest.importorskip("docker")
    from orchard.sandbox.backends.docker.config import DockerConfig

    base_url = require_daemon()
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))
    suite = tmp_path / "suite"
    suite.mkdir()
    _dockerfile_task(suite, "built", DOCKERFILE.replace("COPY files/note.txt", "ADD files/note.txt"))
    image = load_task_dir(suite / "built").environment.image
    api = docker.APIClient(base_url=base_url, version="auto")
    tagged = not api.images(name="debian:bookworm-slim")
    if tagged:
        api.tag(TEST_IMAGE, "debian", "bookworm-slim")
    config = DockerConfig(base_url=base_url, default_image=TEST_IMAGE, pull="never", run_dir=short_tmp / "run",
                          bundle_cache_dir=tmp_path / "home" / "cache")
    try:
        (check,) = await validate_suite(suite, backend=config)
        assert (check.valid, check.gold_reward, check.empty_reward) == (True, 1.0, 0.0), check.problems
        assert api.images(name=image)
    finally:
        for name in [image] + (["debian:bookworm-slim"] if tagged else []):
            if api.images(name=name):
                api.remove_image(name)
        api.close()


# --- docs/suites.md -------------------------------------------------------------------------------------

DOC = doc_blocks.ROOT / "docs" / "suites.md"


def test_the_pages_commands_layouts_and_task_tomls_are_the_real_ones():
    doc_blocks.check_cli_lines(DOC)
    doc_blocks.check_diagram_blocks(DOC)
    doc_blocks.check_in_file_blocks(DOC)
    # (its `claw-bench` example runs in tests/test_claw_bench_suite.py)
    assert {kind for kind, *_ in doc_blocks.blocks(DOC)} == {"cli", "diagram", "in-file", "python", "claw-bench"}


@pytest.mark.slow
def test_the_pages_python_runs_as_written(debian_home, monkeypatch, capsys):
    monkeypatch.setenv("ORCHARD_HOME", str(debian_home))
    (_, code, line), = doc_blocks.of_kind(DOC, "python")
    doc_blocks.run_python(code, f"suites.md:{line}", {})
    printed = capsys.readouterr().out
    assert printed.strip() == code.split("# ", 1)[1].splitlines()[0].strip()
