"""Verifier for mini-003: each check is a share of the score (checks passed / total)."""

import json
from pathlib import Path

import pytest


@pytest.fixture
def counts(workspace):
    path = Path(workspace) / "counts.json"
    assert path.exists(), "counts.json not found in the workspace"
    return json.loads(path.read_text())


def test_lines(counts):
    assert counts.get("lines") == 3


def test_words(counts):
    assert counts.get("words") == 20


def test_most_common(counts):
    assert counts.get("most_common") == "the"
