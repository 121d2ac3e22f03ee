"""A task's tools over MCP end to end through the real evaluator (the scripted model, the local backend as
root), with a real MCP server (the `mcp` SDK's MCPServer) inside the sandbox over streamable HTTP (run as a
service: its notes are its state, read by the services grader) and over stdio: react offers them as
function tools and records each call with its observation; mini-swe-agent reaches them with `mcp-call`;
a harness that cannot take MCP tools is refused before any sandbox; an MCP server that fails is a clear
error naming the task."""

from __future__ import annotations

import sys

import pytest

from orchard.core.errors import InvalidRequest
from orchard.core.task import ServicesGrader, Task, TaskEnvironment, TaskFile, TaskMCPServer
from orchard.core.task_suite import TaskSuite
from orchard.eval.runner import run_eval
from orchard.harnesses.mcp.install import MCP_CALL_PATH
from tests.harness_rig import SCRIPTED, scripted_config, tool_calls
from tests.test_eval import evaluate, trajectories

# The notes server: add_note keeps a note in its state directory (its cwd), so the grader can read it.
NOTES = r"""
import os, sys
from mcp.server.mcpserver import Image, MCPServer
server = MCPServer("notes")
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")  # a PNG's first bytes

@server.tool()
def add_note(title: str, body: str) -> str:
    '''Keep a note.'''
    with open(os.path.join(os.environ.get("ORCHARD_SERVICE_STATE", "."), "notes.txt"), "a") as f:
        f.write(f"{title}: {body}\n")
    return f"kept {title}"

@server.tool()
def shout(text: str) -> str:
    '''The text in capitals.'''
    return text.upper()

@server.tool()
def snapshot() -> Image:
    '''A picture of the notes.'''
    return Image(data=PNG, format="png")

if sys.argv[1] == "http":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
else:
    server.run("stdio")
"""
PYTHON = sys.executable  # the host image's: it has the mcp package
NOTE_CALL = {"name": "add_note", "arguments": {"title": "groceries", "body": "milk"}}  # as a native client names it


HTTP_NOTES = TaskMCPServer(name="notes", command=f"{PYTHON} /tmp/notes.py http 8040", port=8040)


def notes_task(*servers: TaskMCPServer) -> Task:
    servers = servers or (HTTP_NOTES, TaskMCPServer(name="loud", command=f"{PYTHON} /tmp/notes.py stdio",
                                                    transport="stdio"))
    return Task(id="keep-a-note", instruction="Keep a note titled groceries saying milk.",
                environment=TaskEnvironment(image="host", mcp_servers=list(servers),
                                            files=[TaskFile(path="/tmp/notes.py", content=NOTES)]),
                grader=ServicesGrader(script='grep -q "groceries: milk" "$ORCHARD_SERVICE_MCP_NOTES_STATE/notes.txt"'))


@pytest.fixture
def home(sandbox_home):
    return sandbox_home


async def run(home, out, scripted, replies, task=None, harness="react") -> list:
    scripted.load(replies)
    await evaluate(home, out, model=SCRIPTED, config=scripted_config(scripted), tasks=None, harness=harness,
                   suite=TaskSuite(name="mcp-suite", tasks=[task or notes_task()]))
    return trajectories(out)


async def test_react_offers_the_mcp_tools_and_records_each_call(home, tmp_path, scripted):
    (done,) = await run(home, tmp_path / "run", scripted, [
        tool_calls(("notes__add_note", {"title": "groceries", "body": "milk"}), ("loud__shout", {"text": "done"}),
                   ("notes__snapshot", {})),
        tool_calls(("submit", {}))])
    assert done.outcome.resolved, done.outcome
    offered = {tool["function"]["name"] for tool in done.agent.tool_definitions}
    assert {"notes__add_note", "notes__shout", "loud__add_note", "loud__shout", "bash", "submit"} <= offered
    (step,) = [s for s in done.steps if s.tool_calls and s.tool_calls[0].function_name == "notes__add_note"]
    kept, shouted, snapshot = step.observation.results
    assert (kept.content, shouted.content) == ("kept groceries", "DONE")
    assert [r.source_call_id for r in step.observation.results] == [c.tool_call_id for c in step.tool_calls]
    # an image result: the model reads a line describing it; the trajectory keeps the image, written beside it
    text, image = snapshot.content
    assert text.text.startswith("[image: image/png")
    assert (tmp_path / "run" / image.source.path).read_bytes() == bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000")
    assert "orchard.pending_images" not in done.extra


async def test_mini_swe_agent_calls_the_tools_with_mcp_call(home, tmp_path, scripted):
    call = f"{MCP_CALL_PATH} notes add_note '{{\"title\": \"groceries\", \"body\": \"milk\"}}'"
    (done,) = await run(home, tmp_path / "run", scripted, [
        tool_calls(("bash", {"command": call})),
        tool_calls(("bash", {"command": f"{MCP_CALL_PATH} loud shout '{{\"text\": \"ok\"}}'"})),
        tool_calls(("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}))], harness="mini-swe-agent")
    assert done.outcome.resolved, done.outcome
    first_user = next(s for s in done.steps if s.source == "user").message
    assert "notes add_note: Keep a note." in first_user and MCP_CALL_PATH in first_user
    observations = [r.content for s in done.steps if s.observation for r in s.observation.results]
    assert any("kept groceries" in o for o in observations) and any("OK" in o for o in observations)


async def test_a_harness_without_mcp_tools_is_refused_before_any_sandbox(home, tmp_path, scripted, monkeypatch):
    """Every built-in harness takes MCP tools; one that does not (a plug-in without `mcp_tools`, here react
    with it taken away) is refused by `orchard eval` before anything starts."""
    from orchard.harnesses.react.harness import ReActHarness

    monkeypatch.setattr(ReActHarness, "mcp_tools", False)
    with pytest.raises(InvalidRequest, match="harness 'react' cannot give its model a task's MCP tools.*keep-a-note"):
        await run_eval(harness="react", model=SCRIPTED, suite=TaskSuite(name="mcp-suite", tasks=[notes_task()]),
                       out_dir=tmp_path / "run", gateway_config=scripted_config(scripted))
    assert not (tmp_path / "run").exists()


async def test_an_mcp_server_that_fails_is_an_error_naming_the_task(home, tmp_path, scripted):
    broken = TaskMCPServer(name="broken", command="echo no such server >&2; exit 3", transport="stdio")
    (trajectory,) = await run(home, tmp_path / "run", scripted, [tool_calls(("submit", {}))],
                              task=notes_task(broken))
    assert trajectory.exit_status == "environment_error", trajectory.outcome
    assert "task keep-a-note: its MCP tools could not be listed: MCP server broken" in trajectory.outcome.error
    assert "no such server" in trajectory.outcome.error


def test_the_docs_task_is_valid():
    """docs/tools-mcp.md: the declared task is a valid Task whose http server runs as a service."""
    from tests import doc_blocks

    (task,) = doc_blocks.check_data_blocks(doc_blocks.ROOT / "docs" / "tools-mcp.md", "json")
    assert [s.name for s in task.environment.all_services] == ["mcp-notes"]
    assert task.environment.sandbox_spec().services
