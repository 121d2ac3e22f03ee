"""The layering docs/architecture.md draws, checked against the code's imports (every `import` and
`from ... import` in orchard/, at module level or inside functions): each package imports only the
packages the page puts below it, the in-sandbox agent imports nothing of Orchard, production code never
imports the test doubles in orchard.testing, and no module imports one that imports it back."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "orchard"

BELOW = {"orchard.core", "orchard.util"}
# The package root's face (`import orchard`, its version), for the packages above it. orchard/__init__.py
# imports core and util, so neither may import it back; the agent imports nothing of Orchard.
PACKAGE_FACE = {"orchard", "orchard.__version__"}
WITHOUT_FACE = {"orchard.core", "orchard.util", "orchard.sandbox.agent", "orchard.worlds.claw"}
# package -> the Orchard packages it may import (besides itself). Longest prefix wins. Core is the ground
# floor: it imports nothing of Orchard; util imports core only.
ALLOWED: dict[str, set[str]] = {
    "orchard.core": set(),
    "orchard.util": {"orchard.core"},
    "orchard.sandbox.agent": set(),
    # What a task brings into its sandbox: the Claw world runs there on the standard library and itself alone
    # (it is run as the top-level package `claw`); its task spec, made on the host, is above core.
    "orchard.worlds": BELOW,
    "orchard.worlds.claw": set(),
    "orchard.worlds.claw.task": BELOW | {"orchard.worlds.claw"},
    "orchard.policies": BELOW,
    "orchard.harnesses": BELOW,
    "orchard.gateway": BELOW | {"orchard.policies"},
    "orchard.sandbox": BELOW,
    "orchard.testing": BELOW | {"orchard.gateway", "orchard.policies", "orchard.sandbox"},
    # The harness suite runs a harness as `orchard eval` does, so it sits above the evaluator.
    "orchard.testing.harness_conformance": BELOW | {"orchard.gateway", "orchard.policies", "orchard.sandbox",
                                                    "orchard.eval", "orchard.testing"},
    "orchard.eval": BELOW | {"orchard.sandbox", "orchard.gateway", "orchard.policies", "orchard.harnesses",
                     "orchard.worlds"},
    "orchard.recipes": BELOW | {"orchard.sandbox", "orchard.gateway", "orchard.policies", "orchard.harnesses",
                                "orchard.eval", "orchard.worlds"},
    "orchard.cli": BELOW | {"orchard.sandbox", "orchard.gateway", "orchard.policies", "orchard.harnesses",
                            "orchard.eval", "orchard.recipes", "orchard.worlds"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The Orchard names `path` imports, anywhere in it. `from X import a` gives X and X.a (a submodule or a
    name of X's: the cycle test keeps the modules); `from orchard import a` gives orchard.a only."""
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
            # `from orchard import testing` imports a package, not the root's face
            found.update(f"{name}.{alias.name}" for alias in node.names)
            if name != "orchard":
                found.add(name)
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
    face = PACKAGE_FACE if package not in WITHOUT_FACE else set()
    wrong = {name for name in _imports(path) if not _within(name, allowed) and name not in face}
    wrong = sorted(name for name in wrong if name.rpartition(".")[0] not in wrong)  # the modules, not their names
    assert not wrong, f"{module} ({package}) imports {wrong}: see docs/architecture.md for what it may use"


def test_production_code_never_imports_the_test_doubles():
    users = sorted(_module_name(path) for path in _sources()
                   if not _within(_module_name(path), {"orchard.testing"})
                   and any(_within(name, {"orchard.testing"}) for name in _imports(path)))
    assert not users, f"{users} import orchard.testing, which holds test doubles and suites only"


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of orchard/ it imports, at module level or inside functions."""
    paths = {_module_name(path): path for path in _sources()}
    return {module: {name for name in _imports(path) if name in paths and name != module}
            for module, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle through each module that is on any (a, b, ..., a), each circle once."""
    circles = {}
    for start in sorted(graph):
        came_from = {start: None}
        queue = deque([start])
        while queue:
            module = queue.popleft()
            if start in graph[module]:  # back at the start: the shortest way round
                chain = [module]
                while came_from[chain[-1]] is not None:
                    chain.append(came_from[chain[-1]])
                chain.reverse()
                first = chain.index(min(chain))  # one circle, whichever module it was found from
                circles.setdefault(tuple(chain[first:] + chain[:first]), None)
                break
            for imported in sorted(graph[module] - came_from.keys()):
                came_from[imported] = module
                queue.append(imported)
    return [[*circle, circle[0]] for circle in circles]


def test_circles_are_found_and_told_as_chains():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"b"}, "e": {"a"}}
    assert _circles(graph) == [["a", "b", "a"], ["b", "c", "d", "b"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    circles = _circles(_import_graph())
    assert not circles, "import circles (move the shared piece into a module of its own):\n" + "\n".join(
        " → ".join(circle) for circle in circles)


def test_each_backend_keeps_to_its_package():
    """A backend's package (orchard/sandbox/backends/<name>/) imports no other backend's: what several use
    sits at backends/ itself, which imports none of them either. Harness bundles are built and stored below
    the backends that mount them: orchard/sandbox/harness_bundles imports no backend."""
    backends = PACKAGE / "sandbox" / "backends"
    rooms = {f"orchard.sandbox.backends.{p.name}" for p in backends.iterdir() if (p / "__init__.py").is_file()}
    wrong = []
    for path in _sources():
        module = _module_name(path)
        if _within(module, {"orchard.sandbox.harness_bundles"}):
            barred = {"orchard.sandbox.backends"}
        elif _within(module, {"orchard.sandbox.backends"}):
            barred = {room for room in rooms if not _within(module, {room})}
        else:
            continue
        names = {name for name in _imports(path) if _within(name, barred)}
        wrong += [f"{module} → {name}" for name in sorted(names) if name.rpartition(".")[0] not in names]
    assert rooms >= {"orchard.sandbox.backends.local", "orchard.sandbox.backends.docker",
                     "orchard.sandbox.backends.kubernetes"}
    assert not wrong, "imports across backends (move the shared piece up to orchard/sandbox/backends/):\n" + \
        "\n".join(wrong)
