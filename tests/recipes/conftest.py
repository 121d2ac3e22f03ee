"""Fixtures shared by the training-recipe test modules."""

from pathlib import Path

import pytest

from tests.recipes.sft_rig import evaluate


@pytest.fixture(scope="session")
def oracle_run(tmp_path_factory) -> Path:
    """The run directory of react + the oracle on one swe-mini task (resolved; three calls: apply, check,
    submit), made once per session: the modules that train on it only read it."""
    return evaluate(tmp_path_factory.mktemp("oracle"))


@pytest.fixture(scope="module")
def torch_one_thread():
    """torch, limited to one thread while the module runs (the tiny models gain nothing from more)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    from orchard.recipes.common.tiny_models import smollm2_tokenizer

    return smollm2_tokenizer()
