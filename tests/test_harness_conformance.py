"""The harness conformance suite (orchard/testing/harness_conformance/) run for every built-in harness, as a
plug-in author runs it for theirs (docs/harness-conformance.md): the in-process ones (react, mini-swe-agent)
and the in-sandbox ones from their harness bundles, built at most once per session into the cache every
harness test module shares (tests/harness_bundle_rig.py): kimi-cli, openhands, and the zero-code `cli`
harness running the small tool-calling program of tests/test_harness_cli.py from the tiny test bundle. And the
check that docs/harness-conformance.md shows this very file's code."""

from __future__ import annotations

from typing import ClassVar

import pytest

from orchard.testing.harness_conformance import HarnessConformance
from tests import doc_blocks
from tests.test_harness_bundles import bundle_home  # noqa: F401  (a fixture: the tiny bundle, built once)
from tests.test_harness_cli import OPTIONS


class BuiltIn(HarnessConformance):
    """A built-in harness: its Orchard home links the session's cache (agent and harness bundles built once)."""

    bundles: ClassVar[tuple[str, ...]] = ()

    @pytest.fixture(scope="class")
    @classmethod
    def orchard_home(cls, tmp_path_factory, session_bundles):
        return session_bundles.home(tmp_path_factory.mktemp("conformance-home"), *cls.bundles)


class TestReact(BuiltIn):
    harness = "react"
    deadline_s = 15.0


class TestMiniSweAgent(BuiltIn):
    harness = "mini-swe-agent"
    harness_options = {"step_limit": 10}
    deadline_s = 15.0


@pytest.mark.slow
class TestKimiCli(BuiltIn):
    harness = "kimi-cli"
    bundles = ("kimi-cli",)
    deadline_s = 40.0  # Kimi is stopped a fixed 15 s before the deadline, and starts in the sandbox


@pytest.mark.slow
class TestOpenHands(BuiltIn):
    harness = "openhands"
    bundles = ("openhands",)
    harness_options = {"model_retries": 0}  # a failing model call fails the conversation at once
    # three drivers import the SDK at once in their sandboxes: on two busy cores that took over 30 s
    deadline_s = 60.0


class TestCli(BuiltIn):
    harness = "cli"
    harness_options = {key: value for key, value in OPTIONS.items() if key != "timeout_s"}  # the deadline rules
    deadline_s = 20.0

    @pytest.fixture(scope="class")
    @classmethod
    def orchard_home(cls, bundle_home):  # noqa: F811  (the tiny bundle's home, shared with its tests)
        return bundle_home


def test_the_harness_conformance_guide_quotes_this_file():
    doc = doc_blocks.ROOT / "docs" / "harness-conformance.md"
    assert {kind for kind, *_ in doc_blocks.blocks(doc)} == {"in-file"}
    doc_blocks.check_in_file_blocks(doc)
