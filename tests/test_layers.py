"""The layering docs/architecture.md draws, checked against the code's imports (every `import` and
`from ... import` in orchard/, at module level or inside functions): each package imports only the
packages the page puts below it, the in-sandbox agent imports nothing of Orchard, and production code
never imports the test doubles in orchard.testing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "orchard"

BELOW = {"orchard.core", "orchard.util"}
PACKAGE_FACE = {"orchard", "orchard.__version__"}
# package -> the Orchard packages it may import (besides itself). Longest prefix wins.
ALLOWED: dict[str, set[str]] = {
    "orchard.core": {"orchard.util.files"},
    "orchard.util": {"orchard.core"},
    "orchard.sandbox.agent": set(),
    "orchard.policies": BELOW,
    "orchard.harnesses": BELOW,
    "orchard.gateway": BELOW | {"orchard.policies"},
    "orchard.sandbox": BELOW,
    "orchard.testing": BELOW | {"orchard.gateway", "orchard.policies", "orchard.sandbox"},
    "orchard.eval": BELOW | {"orchard.sandbox", "orchard.gateway", "orchard.policies", "orchard.harnesses"},
    "orchard.recipes": BELOW | {"orchard.sandbox", "orchard.gateway", "orchard.policies", "orchard.harnesses",
                                "orchard.eval"},
    "orchard.cli": BELOW | {"orchard.sandbox", "orchard.gateway", "orchard.policies", "orchard.harnesses",
                            "orchard.eval", "orchard.recipes"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    module = _module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # `from orchard import testing` imports a package, `from orchard.x import f` a name of one
            found.update(f"{name}.{alias.name}" for alias in node.names) if name == "orchard" else found.add(name)
    return {name for name in found if name == "orchard" or name.startswith("orchard.")}


def _package_of(module: str) -> str | None:
    matches = [package for package in ALLOWED if module == package or module.startswith(package + ".")]
    return max(matches, key=len) if matches else None


def _within(name: str, packages: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_follow_the_layers(path):
    module = _module_name(path)
    package = _package_of(module)
    if package is None:  # orchard/__init__.py, orchard/demo.py: the top, like the CLI
        package = "orchard.cli"
    allowed = ALLOWED[package] | {package}
    face = PACKAGE_FACE if package != "orchard.sandbox.agent" else set()  # the package's version, location
    wrong = sorted(name for name in _imports(path) if not _within(name, allowed) and name not in face)
    assert not wrong, f"{module} ({package}) imports {wrong}: see docs/architecture.md for what it may use"


def test_production_code_never_imports_the_test_doubles():
    users = sorted(_module_name(path) for path in _sources()
                   if _package_of(_module_name(path)) != "orchard.testing"
                   and any(_within(name, {"orchard.testing"}) for name in _imports(path)))
    assert not users, f"{users} import orchard.testing, which holds test doubles and suites only"
