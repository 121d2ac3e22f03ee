"""The adapter depends on Orchard only through its public face: the contracts of `orchard.core` and the helpers
Orchard's docs name for harness authors. Every `import` of the adapter's code (at any depth) is checked against
that list, and no name starting with `_` is imported from Orchard. The driver, which runs inside the sandbox,
imports nothing of Orchard at all: it is the standard library only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from zeroclaw_rig import ADAPTER

SOURCE = ADAPTER / "src" / "orchard_zeroclaw"
# module -> where Orchard documents it for harness authors
PUBLIC = {
    "orchard.core": "docs/harness-adapters.md (the protocol, the sandbox API, dialects, bundles)",
    "orchard.harnesses.in_sandbox": "docs/harness-adapters.md, Writing one (the in-sandbox base)",
    "orchard.harnesses.deadline": "docs/harness-adapters.md and docs/harnesses.md (deadline_margin_s, run_limit_s)",
    "orchard.harnesses.openai_client": "docs/harnesses.md, shared pieces (the OpenAI-compatible client)",
    "orchard.harnesses.mcp.toolset": "docs/tools-mcp.md (a task's MCP tools as function tools)",
    "orchard.util.shell_forms": "docs/harness-adapters.md, A harness's dialect (shell_command)",
}


def imports(path: Path) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.module or "", [alias.name for alias in node.names]))
    return found


def test_the_adapter_imports_only_orchards_public_face():
    wrong = []
    for path in sorted(SOURCE.rglob("*.py")):
        for module, names in imports(path):
            if module != "orchard" and not module.startswith("orchard."):
                continue
            public = any(module == allowed or module.startswith(allowed + ".") for allowed in PUBLIC)
            private = [name for name in names if name.startswith("_")]
            if not public or private:
                wrong.append(f"{path.relative_to(ADAPTER)}: {module} {private or ''}")
    assert not wrong, "imports beyond Orchard's documented face:\n" + "\n".join(wrong)


def test_the_driver_runs_on_the_standard_library_alone():
    driver = SOURCE / "real" / "driver.py"
    modules = {module.split(".")[0] for module, _ in imports(driver)}
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)
