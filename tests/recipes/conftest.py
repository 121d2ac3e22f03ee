"""Fixtures shared by the training-recipe test modules."""

from pathlib import Path

import pytest

from tests.recipes.sft_rig import evaluate


@pytest.fixture(scope="session")
def oracle_run(tmp_path_factory) -> Path:
    """The run directory of react + the oracle on one swe-mini task (resolved; three calls: apply, check,
    submit), made once per session: the modules that train on it only read it."""
    return evaluate(tmp_path_factory.mktemp("oracle"))
