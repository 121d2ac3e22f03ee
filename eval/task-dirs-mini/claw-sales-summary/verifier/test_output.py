"""Verifier for mini-001: each check is a share of the score (checks passed / total)."""

import json
from pathlib import Path

import pytest


@pytest.fixture
def summary(workspace):
    path = Path(workspace) / "summary.json"
    assert path.exists(), "summary.json not found in the workspace"
    return json.loads(path.read_text())


def test_summary_exists(workspace):
    assert (Path(workspace) / "summary.json").is_file()


def test_total(summary):
    assert summary.get("total") == pytest.approx(685.75)


def test_count(summary):
    assert summary.get("count") == 6


def test_best_region(summary):
    assert summary.get("best_region") == "north"
