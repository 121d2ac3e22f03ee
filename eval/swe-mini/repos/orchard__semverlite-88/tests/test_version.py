import pytest

from semverlite import Version


def test_parse_and_print_roundtrip():
    assert str(Version.parse("1.2.3-rc.1+build.7")) == "1.2.3-rc.1+build.7"


def test_release_sorts_after_prerelease():
    assert Version.parse("1.0.0-rc.1") < Version.parse("1.0.0")


def test_build_metadata_ignored_for_equality():
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")


def test_invalid_versions_rejected():
    for text in ["1.0", "01.0.0", "1.0.0-", "1.0.0-a..b"]:
        with pytest.raises(ValueError):
            Version.parse(text)
