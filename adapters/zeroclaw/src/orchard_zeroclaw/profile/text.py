"""The text work of the profile's file and search tools, as ZeroClaw 0.8.4 does it: the diagnostic of a
`file_edit` whose text is not there (crates/zeroclaw-tools/src/file_edit.rs), `glob_search`'s patterns
(the glob crate's: `*` and `?` within one path component, `[...]` classes, `**` for any number of
directories) and `content_search`'s output (crates/zeroclaw-tools/src/content_search.rs: paths relative to
the workspace, capped, and a `Total:` line)."""

from __future__ import annotations

import re


def no_match_diagnostic(content: str, old: str) -> str:
    """ZeroClaw's answer when `old` is not in the file: whether it is there but for its indentation."""
    def strip_leading(text: str) -> str:
        return "\n".join(line.lstrip() for line in text.splitlines())

    near = strip_leading(content).count(strip_leading(old))
    if near == 0:
        return "old_string not found in file"
    if near == 1:
        return ("old_string not found exactly: a block matching it ignoring leading whitespace exists exactly "
                "once. The difference is indentation (width, or tabs vs spaces). Re-read the target region and "
                "copy its leading whitespace exactly, then retry.")
    return (f"old_string not found exactly: {near} blocks match it when leading whitespace is ignored. "
            "Indentation differs and the target is ambiguous. Re-read the region, copy exact indentation, and "
            "include enough surrounding lines to make the match unique.")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A workspace-relative glob as a regex over relative paths: `*` and `?` within one component, `[...]`
    classes, `**` for any number of directories."""
    parts = pattern.split("/")
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
            continue
        regex += _component(part) + ("" if last else "/")
    return re.compile(regex, re.S)


def _component(part: str) -> str:
    out, i = "", 0
    while i < len(part):
        char = part[i]
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[" and "]" in part[i + 2:]:
            close = part.index("]", i + 2)
            inner = part[i + 1:close]
            out += "[" + ("^" + inner[1:] if inner.startswith("!") else inner.replace("\\", "\\\\")) + "]"
            i = close
        else:
            out += re.escape(char)
        i += 1
    return out


_CONTENT = re.compile(r"^(?P<path>.*?)(?P<sep>[:-])(?P<line>\d+)(?P=sep)")


def format_search_output(raw: str, workdir: str, mode: str, max_results: int) -> str:
    """grep's output as ZeroClaw formats it: paths relative to the workspace, capped, and a `Total:` line."""
    if not raw.strip():
        return "No matches found."
    prefix = workdir.rstrip("/") + "/"
    lines: list[str] = []
    files: set[str] = set()
    matches, truncated = 0, False
    for line in raw.splitlines():
        if not line:
            continue
        line = line[len(prefix):] if line.startswith(prefix) else line
        if mode == "files_with_matches":
            if line not in files:
                files.add(line)
                lines.append(line)
                if len(lines) >= max_results:
                    truncated = True
                    break
            continue
        if mode == "count":
            path, _, count = line.rpartition(":")
            if count.isdigit() and int(count) > 0:
                files.add(path)
                matches += int(count)
                lines.append(f"{path}:{count}")
                if len(lines) >= max_results:
                    truncated = True
                    break
            continue
        if line == "--":
            lines.append(line)
            continue
        parsed = _CONTENT.match(line)
        is_match = parsed is None or parsed.group("sep") == ":"
        if parsed is not None:
            files.add(parsed.group("path"))
        if is_match:
            if matches >= max_results:
                truncated = True
                break
            matches += 1
        lines.append(line)
    if not lines:
        return "No matches found."
    text = "\n".join(lines)
    if truncated:
        text += f"\n\n[Results truncated: showing first {max_results} results]"
    if mode == "files_with_matches":
        return text + f"\n\nTotal: {len(files)} files"
    if mode == "count":
        return text + f"\n\nTotal: {matches} matches in {len(files)} files"
    return text + f"\n\nTotal: {matches} matching lines in {len(files)} files"
