import pytest

from ledgerlite import format_amount, parse_amount, split_evenly


def test_parse_whole_amount():
    assert parse_amount("12") == 1200


def test_parse_thousands_separator():
    assert parse_amount("1,234.50") == 123450


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_amount("12.3.4")


def test_format_negative():
    assert format_amount(-123456) == "-1,234.56"


def test_split_evenly_keeps_total():
    assert split_evenly(1000, 3) == [334, 333, 333]
