"""Every example in the docs is checked by a test. Each fenced block of README.md and docs/*.md is preceded by
a `<!-- doc-test: KIND [ARGUMENT] -->` marker (tests/doc_blocks.py), and CHECKED_BY below says which test
module checks each kind on each page. This test fails on a block without a marker, on a page whose blocks
carry a kind no module is registered for, and on a registration that no longer matches the page (a kind the
page does not use, a module that does not exist or does not name the page).

The checks themselves live in the modules named here. Slow examples are checked for shape only, never run:
the Kubernetes cluster and deployment commands (docs/k8s-dev-cluster.md, docs/kubernetes.md) and the
`make bench` / `python -m bench.run` lines (docs/BENCHMARKS.md): the script, its subcommand, the make
target, the module and its options exist (tests/test_docs_pages.py)."""

from __future__ import annotations

import re

from tests import doc_blocks

ROOT = doc_blocks.ROOT
PAGES_MODULE = "tests/test_docs_pages.py"

# page -> {test module: the kinds of the page's blocks it checks}
CHECKED_BY: dict[str, dict[str, set[str]]] = {
    "README.md": {"tests/test_readme.py": {"make", "python", "cli"}},
    "docs/writing-a-backend.md": {"tests/test_docs_backends.py": {"cli", "protocol", "capabilities", "config",
                                                                  "in-file"}},
    "docs/harness-adapters.md": {"tests/test_docs_harness_adapters.py": {"protocol", "run", "example-file",
                                                                         "in-file", "cli"}},
    "docs/docker.md": {"tests/test_docs_docker.py": {"daemon", "cli", "run"}},
    "docs/training.md": {"tests/recipes/test_training_docs.py": {"cli", "python", "example-file", "in-file"}},
    "docs/conformance.md": {"tests/conformance/test_local.py": {"in-file"}},
    "docs/harness-conformance.md": {"tests/test_harness_conformance.py": {"in-file"}},
    "docs/models.md": {"tests/test_model_registry.py": {"model-module", "model-entry-point", "model-cli"},
                       PAGES_MODULE: {"cli", "yaml"}},
    "docs/evaluation.md": {"tests/test_trial.py": {"cli"}, "tests/test_eval_attempts.py": {"python"}},
    "docs/cross-harness.md": {"tests/test_study.py": {"cli", "study-run", "python"}},
    "docs/trajectory.md": {"tests/test_trajectory.py": {"python"}, PAGES_MODULE: {"fields"}},
    "docs/agent-protocol.md": {PAGES_MODULE: {"agent-start"}},
    "docs/BENCHMARKS.md": {PAGES_MODULE: {"shell"}},
    "docs/architecture.md": {PAGES_MODULE: {"diagram"}},
    "docs/gateway.md": {PAGES_MODULE: {"python", "yaml", "output", "json", "shell"}},
    "docs/harnesses.md": {PAGES_MODULE: {"python"}, "tests/test_harness_cli.py": {"cli"}},
    "docs/harness-bundles.md": {"tests/test_harness_bundles.py": {"python", "cli", "layout", "toml", "shell"}},
    "docs/k8s-dev-cluster.md": {PAGES_MODULE: {"shell", "diagram"}},
    "docs/kubernetes.md": {PAGES_MODULE: {"shell"}},
    "docs/local-backend.md": {PAGES_MODULE: {"output"}},
    "docs/networking.md": {"tests/test_docs_networking.py": {"python", "cli", "yaml"}},
    "docs/sandbox-ports.md": {"tests/test_docs_ports.py": {"python"}},
    "docs/suites.md": {"tests/test_task_dirs.py": {"cli", "diagram", "in-file", "python"},
                       "tests/test_claw_bench_suite.py": {"claw-bench"}},
    "docs/services.md": {"tests/test_task_services.py": {"json", "python"}},
    "docs/tools-mcp.md": {"tests/test_task_mcp.py": {"json"}},
    "docs/claw.md": {"tests/test_claw_mini.py": {"cli", "claw-actions", "diagram", "in-file", "json", "claw-seed",
                                                  "python"},
                     "tests/test_claw_eval_import.py": {"claw-eval-cli", "claw-eval-output", "claw-eval-yaml"},
                     "tests/test_tau2_airline.py": {"tau2-cli", "tau2-report"},
                     "tests/test_claw_harnesses.py": {"claw-harnesses"},
                     "tests/recipes/test_sft_claw.py": {"claw-train"},
                     "tests/recipes/test_rl_claw.py": {"claw-train"}},
    "docs/images.md": {"tests/test_oci_images.py": {"shell", "cli", "python"}},
    "docs/orchestrator.md": {PAGES_MODULE: {"signatures"}},
    "docs/pools.md": {"tests/test_docs_pools.py": {"python", "yaml", "cli"}},
    "docs/robustness.md": {"tests/test_chaos.py": {"chaos-run", "chaos-output"}},
}

FENCE = re.compile(r"^\s*(```|~~~)")


def test_every_block_of_every_page_is_marked_and_checked_by_a_registered_test():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems = []
    for doc in pages:
        name = str(doc.relative_to(ROOT))
        try:
            blocks = doc_blocks.blocks(doc)  # fails on a block without a marker
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        fences = sum(1 for line in doc.read_text().split("\n") if FENCE.match(line))
        if fences != 2 * len(blocks):
            problems.append(f"{name}: {fences} fence lines for {len(blocks)} blocks (an indented or ~~~ "
                            f"fence the marker parser does not see?)")
        kinds = {kind for kind, *_ in blocks}
        registered = CHECKED_BY.get(name, {})
        handled = set().union(*registered.values())
        if kinds - handled:
            problems.append(f"{name}: no test is registered for its kinds {sorted(kinds - handled)} (CHECKED_BY)")
        if handled - kinds:
            problems.append(f"{name}: registered kinds {sorted(handled - kinds)} are not on the page")
        for module in registered:
            if not (ROOT / module).is_file():
                problems.append(f"{name}: {module} does not exist")
            elif doc.name not in (ROOT / module).read_text():
                problems.append(f"{name}: {module} does not name the page it is registered to check")
    for name in CHECKED_BY:
        if not (ROOT / name).is_file():
            problems.append(f"{name} is registered in CHECKED_BY but does not exist")
    assert not problems, "\n".join(problems)
