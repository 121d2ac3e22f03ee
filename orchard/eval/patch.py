"""The agent's work as a patch: what changed in the task's workdir between the end of environment setup
and the end of the agent's run.

The base is a snapshot, not the repository's HEAD: right after setup the whole working tree — tracked,
untracked and ignored files alike, caches left out — is written as a git tree into a git directory of the
evaluator's own (`SNAPSHOT_GIT_DIR`, outside the workdir, so the agent's repository is never touched). The
patch is the diff from that tree to the working tree as the agent left it. So an agent that commits its
fix, rewrites history, or writes files its repository's `.gitignore` hides still has all of its work
graded, and files the setup made (ignored build products, say) are not mistaken for the agent's. The
grader applies the patch to a fresh sandbox after the same setup.

Binary-safe: binary files are written as git binary patches; text that is not UTF-8 is taken as binary
too, so the patch is always valid text."""

from __future__ import annotations

import shlex

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import Sandbox

SNAPSHOT_GIT_DIR = "/tmp/.orchard-base.git"
SNAPSHOT_TIMEOUT_S = 300.0
PATCH_MAX_BYTES = 50_000_000
# Never part of the agent's work: caches its commands leave behind (git pathspecs).
EXCLUDED = (":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc", ":(exclude,glob)**/.pytest_cache/**",
            ":(exclude,glob)**/.mypy_cache/**")
# Any owner is fine: the evaluator only reads the workdir (a sandbox may map file owners differently).
_GIT = "git -c safe.directory='*' -c core.autocrlf=false -c core.quotepath=false"


def _git_env(workdir: str) -> str:
    git_dir = shlex.quote(SNAPSHOT_GIT_DIR)
    return (f"export GIT_DIR={git_dir} GIT_WORK_TREE={shlex.quote(workdir)} GIT_INDEX_FILE={git_dir}/index "
            "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null; ")


def _stage_all() -> str:
    return f"{_GIT} add -A -f -- . {' '.join(shlex.quote(p) for p in EXCLUDED)}"


async def snapshot_base(sandbox: Sandbox, workdir: str) -> str:
    """Write the workdir's current state as the base tree; returns the tree's id. Raises InvalidRequest
    when it cannot be taken (no git in the image, an unreadable workdir): the task's environment is broken."""
    git_dir = shlex.quote(SNAPSHOT_GIT_DIR)
    command = (f"rm -rf {git_dir} && {_GIT} init -q --bare {git_dir} && " + _git_env(workdir)
               + f"{_stage_all()} && {_GIT} write-tree")
    result = await sandbox.exec(command, cwd=workdir, timeout=SNAPSHOT_TIMEOUT_S)
    tree = result.stdout.strip()
    if result.exit_code != 0 or result.timed_out or len(tree) not in (40, 64):
        raise InvalidRequest(f"could not snapshot the workdir {workdir} after setup (git is needed in the task's "
                             f"image): {result.output.strip()[-500:] or 'timed out'}")
    return tree


async def extract_patch(sandbox: Sandbox, workdir: str, base_tree: str) -> str:
    """The agent's work as a diff from `base_tree`: committed, uncommitted, untracked and ignored changes,
    binary files as git binary patches. An empty string when nothing changed. InvalidRequest when the diff
    cannot be taken or is over PATCH_MAX_BYTES: the agent's doing (it removed the snapshot, filled the
    disk, made a gigantic change), which is its failed attempt."""
    patch_file = f"{SNAPSHOT_GIT_DIR}/agent.patch"
    command = (_git_env(workdir) + f"test -d \"$GIT_DIR\" || {{ echo 'the base snapshot {SNAPSHOT_GIT_DIR} was "
               f"removed'; exit 3; }}; {_stage_all()} && {_diff(base_tree)} > {patch_file}")
    data = await _run_diff(sandbox, workdir, command, patch_file)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return await _with_non_utf8_as_binary(sandbox, workdir, base_tree, patch_file)


def _diff(base_tree: str, *, all_binary: bool = False) -> str:
    attributes = f" -c core.attributesFile={SNAPSHOT_GIT_DIR}/all-binary" if all_binary else ""
    return f"{_GIT}{attributes} diff --cached --binary --no-color --no-ext-diff {base_tree}"


async def _with_non_utf8_as_binary(sandbox: Sandbox, workdir: str, base_tree: str, patch_file: str) -> str:
    """Text that is not UTF-8 cannot be carried in a JSON string: such files are diffed as git binary
    patches, file by file, and every other file stays a readable text diff."""
    names = await sandbox.exec(_git_env(workdir) + f"{_GIT} diff --cached --name-only -z {base_tree}", cwd=workdir,
                               timeout=SNAPSHOT_TIMEOUT_S)
    if names.exit_code != 0:
        raise InvalidRequest(f"could not list the agent's changed files: {names.output.strip()[-500:]}")
    parts = []
    for path in filter(None, names.stdout.split("\0")):
        pathspec = shlex.quote(f":(literal){path}")
        command = _git_env(workdir) + f"{_diff(base_tree)} -- {pathspec} > {patch_file}"
        data = await _run_diff(sandbox, workdir, command, patch_file)
        try:
            parts.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            command = (_git_env(workdir) + f"echo '* binary' > {SNAPSHOT_GIT_DIR}/all-binary && "
                       f"{_diff(base_tree, all_binary=True)} -- {pathspec} > {patch_file}")
            parts.append((await _run_diff(sandbox, workdir, command, patch_file)).decode("ascii"))
    return "".join(parts)


async def _run_diff(sandbox: Sandbox, workdir: str, command: str, patch_file: str) -> bytes:
    result = await sandbox.exec(command, cwd=workdir, timeout=SNAPSHOT_TIMEOUT_S)
    if result.exit_code != 0 or result.timed_out:
        raise InvalidRequest(f"could not take the agent's diff in {workdir}: "
                             f"{result.output.strip()[-500:] or 'timed out'}")
    size = await sandbox.exec(["stat", "-c", "%s", patch_file], timeout=30)
    if size.exit_code == 0 and size.stdout.strip().isdigit() and int(size.stdout.strip()) > PATCH_MAX_BYTES:
        raise InvalidRequest(f"the agent's diff is {int(size.stdout.strip()):,} bytes, over the "
                             f"{PATCH_MAX_BYTES:,} bytes the evaluator grades")
    return await sandbox.read_file(patch_file)
