"""Fixtures shared by test modules."""

import pytest

from tests.harness_rig import gateway_in_front_of, scripted_model


@pytest.fixture(scope="module")
def scripted():
    """The scripted OpenAI-compatible server (a stand-in for the model only), one per test module."""
    with scripted_model() as model:
        yield model


@pytest.fixture(scope="module")
def gateway(scripted):
    """Orchard's real gateway in front of the scripted server."""
    with gateway_in_front_of(scripted) as gw:
        yield gw
