import pytest

from envfile import dumps, loads


def test_dumps_bare_values():
    assert dumps({"PORT": "8080", "HOST": "db.internal"}) == "HOST=db.internal\nPORT=8080\n"


def test_value_with_spaces_roundtrips():
    values = {"GREETING": "hello world # not a comment"}
    assert loads(dumps(values)) == values


def test_loads_comments_and_export():
    text = "# settings\nexport DEBUG=1  # local only\n\nNAME=\"a \\\"b\\\"\"\n"
    assert loads(text) == {"DEBUG": "1", "NAME": 'a "b"'}


def test_invalid_key_rejected():
    with pytest.raises(ValueError):
        dumps({"1BAD": "x"})
