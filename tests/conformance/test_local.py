"""The backend conformance suite (orchard/testing/conformance/) on the local backend, and the check that
docs/conformance.md shows this very file's code."""

import pytest

from orchard.sandbox.backends.registry import backend_config
from orchard.testing.conformance import BackendConformance
from tests import doc_blocks


class TestLocalBackend(BackendConformance):
    @pytest.fixture(scope="class")
    def make_backend_config(self, tmp_path_factory):
        cache = tmp_path_factory.mktemp("bundle-cache")  # the agent bundle: built once, not per home
        return lambda home: backend_config("local", home, bundle_cache_dir=cache)


def test_the_conformance_guide_quotes_this_file():
    doc = doc_blocks.ROOT / "docs" / "conformance.md"
    assert {kind for kind, *_ in doc_blocks.blocks(doc)} == {"in-file"}
    doc_blocks.check_in_file_blocks(doc)
