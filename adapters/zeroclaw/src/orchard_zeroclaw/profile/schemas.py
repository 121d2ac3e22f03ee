"""The profile's tools as the model sees them: ZeroClaw 0.8.4's names, descriptions and argument schemas
(crates/zeroclaw-runtime/src/tools/, crates/zeroclaw-tools/src/), as OpenAI function tools. Two are narrowed
to what the profile does: `file_read` and `file_write` without the base64 encoding, and `delegate` with its
default action only (a synchronous, agentic run of one sub-agent: no background tasks, no parallel fan-out).
A task's MCP tools come after these, named `<server>__<tool>` as ZeroClaw names them."""

from __future__ import annotations

from typing import Any


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def _string(description: str, **more: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **more}


SHELL = _function(
    "shell", "Execute a shell command in the workspace directory",
    {"command": _string("The shell command to execute"),
     "approved": {"type": "boolean", "default": False,
                  "description": "Set true to explicitly approve medium/high-risk commands in supervised mode"}},
    ["command"])
FILE_READ = _function(
    "file_read", "Read file contents with line numbers. Supports partial reading via offset and limit. Binary "
    "and image files are rejected.",
    {"path": _string("Path to the file. Relative paths resolve from workspace root; absolute paths must be "
                     "within the workspace."),
     "offset": {"type": "integer", "description": "Starting line number (1-based, default: 1)."},
     "limit": {"type": "integer", "description": "Maximum number of lines to return (default: all)."}},
    ["path"])
FILE_WRITE = _function(
    "file_write", "Write contents to a file in the workspace.",
    {"path": _string("Path to the file. Relative paths resolve from workspace; outside paths require policy "
                     "allowlist."),
     "content": _string("Content to write.")},
    ["path", "content"])
FILE_EDIT = _function(
    "file_edit", "Edit a file by replacing an exact string match with new content",
    {"path": _string("Path to the file. Relative paths resolve from workspace; outside paths require policy "
                     "allowlist."),
     "old_string": _string("The exact text to find and replace (must appear exactly once in the file)"),
     "new_string": _string("The replacement text (empty string to delete the matched text)")},
    ["path", "old_string", "new_string"])
GLOB_SEARCH = _function(
    "glob_search", "Search for files matching a glob pattern within the workspace. Returns a sorted list of "
    "matching file paths relative to the workspace root. Examples: '**/*.rs' (all Rust files), 'src/**/mod.rs' "
    "(all mod.rs in src).",
    {"pattern": _string("Glob pattern to match files, e.g. '**/*.rs', 'src/**/mod.rs'")},
    ["pattern"])
CONTENT_SEARCH = _function(
    "content_search", "Search file contents by regex pattern within the workspace. Supports ripgrep (rg) with "
    "grep or internal fallback. Output modes: 'content' (matching lines with context), 'files_with_matches' "
    "(file paths only), 'count' (match counts per file). Example: pattern='fn main', include='*.rs', "
    "output_mode='content'.",
    {"pattern": _string("Regular expression pattern to search for"),
     "path": _string("Directory to search in, relative to workspace root. Defaults to '.'", default="."),
     "output_mode": _string("Output format: 'content' (matching lines), 'files_with_matches' (paths only), "
                            "'count' (match counts)", enum=["content", "files_with_matches", "count"],
                            default="content"),
     "include": _string("File glob filter, e.g. '*.rs', '*.{ts,tsx}'"),
     "case_sensitive": {"type": "boolean", "description": "Case-sensitive matching. Defaults to true",
                        "default": True},
     "context_before": {"type": "integer", "description": "Lines of context before each match (content mode "
                                                          "only)", "default": 0},
     "context_after": {"type": "integer", "description": "Lines of context after each match (content mode only)",
                       "default": 0},
     "max_results": {"type": "integer", "description": "Maximum number of results to return. Defaults to 1000",
                     "default": 1000}},
    ["pattern"])
MEMORY_STORE = _function(
    "memory_store", "Store a fact, preference, or note in long-term memory. Use category 'core' for permanent "
    "facts, 'daily' for session notes, 'conversation' for chat context, or a custom category name.",
    {"key": _string("Unique key for this memory (e.g. 'user_lang', 'project_stack')"),
     "content": _string("The information to remember"),
     "category": _string("Memory category: 'core' (permanent), 'daily' (session), 'conversation' (chat), or a "
                         "custom category name. Defaults to 'core'.")},
    ["key", "content"])
MEMORY_RECALL = _function(
    "memory_recall", "Search long-term memory for relevant facts, preferences, or context. Returns scored "
    "results ranked by relevance. Supports keyword search, and recent recall with omitted query or bare '*'.",
    {"query": _string("Keywords or phrase to search for in memory. Omit or pass bare '*' to return recent "
                      "memories."),
     "limit": {"type": "integer", "description": "Max results to return (default: 5)"}},
    [])
MEMORY_FORGET = _function(
    "memory_forget", "Remove a memory by key. Use to delete outdated facts or sensitive data. Returns whether the "
    "memory was found and removed.",
    {"key": _string("The key of the memory to forget")},
    ["key"])
TODO_WRITE = _function(
    "TodoWrite", "Render a live task tracker for the current work. Call this with the COMPLETE current todo list "
    "every time — the new list wholly replaces the previous one. Each todo has `content` (imperative "
    "description), `status` (pending, in_progress, or completed), and optionally `priority` (high, medium, low) "
    "and `activeForm` (present-continuous label shown while in_progress). Keep exactly one item in_progress at a "
    "time. Pass an empty list to clear the tracker.",
    {"todos": {"type": "array", "description": "The complete current todo list (whole-list replace).",
               "items": {"type": "object", "properties": {
                   "content": _string("Imperative task description"),
                   "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                   "priority": {"type": "string", "enum": ["high", "medium", "low"]},
                   "activeForm": _string("Present-continuous label shown while in_progress")},
                   "required": ["content", "status"]}}},
    ["todos"])


def delegate_tool(agents: dict[str, str]) -> dict[str, Any]:
    available = ", ".join(sorted(agents)) or "(none configured)"
    return _function(
        "delegate", "Delegate a subtask to a specialized agent. Use when: a task benefits from a separate, "
        "focused run (exploring a part of the code, checking a finding). The sub-agent iterates with a filtered "
        "tool-call loop and answers once; its answer is this tool's result.",
        {"agent": _string(f"Name of the agent to delegate to. Available: {available}", minLength=1),
         "prompt": _string("The task/prompt to send to the sub-agent", minLength=1),
         "context": _string("Optional context to prepend (e.g. relevant code, prior findings)")},
        ["agent", "prompt"])


BASE_TOOLS = [SHELL, FILE_READ, FILE_WRITE, FILE_EDIT, GLOB_SEARCH, CONTENT_SEARCH, MEMORY_STORE, MEMORY_RECALL,
              MEMORY_FORGET]


def main_tools(agents: dict[str, str]) -> list[dict[str, Any]]:
    """The main agent's tools: the base ones, `delegate` (when there is an agent to reach) and `TodoWrite`."""
    return [*BASE_TOOLS, *([delegate_tool(agents)] if agents else []), TODO_WRITE]


def subagent_tools() -> list[dict[str, Any]]:
    """A delegated run's tools: the base ones (a sub-agent does not delegate further: ZeroClaw's depth 1)."""
    return list(BASE_TOOLS)


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]
