import pytest

from pinspec import max_satisfying, parse_version, satisfies_caret


def test_parse_pads_missing_parts():
    assert parse_version("v1.4") == (1, 4, 0)
    with pytest.raises(ValueError):
        parse_version("1.4.x")


def test_same_version_satisfies():
    assert satisfies_caret("1.4.5", "1.4.5")


def test_newer_minor_satisfies():
    assert satisfies_caret("1.9.0", "1.4.5")


def test_older_patch_rejected():
    assert not satisfies_caret("1.4.4", "1.4.5")
