from datetime import datetime, timezone

import pytest

from logstamp import parse_offset, to_utc


def test_zulu_is_utc():
    assert to_utc("2023-11-05T10:00:00Z") == datetime(2023, 11, 5, 10, 0, tzinfo=timezone.utc)


def test_positive_half_hour_offset():
    assert to_utc("2023-11-05T10:00:00+05:30") == datetime(2023, 11, 5, 4, 30, tzinfo=timezone.utc)


def test_negative_whole_hour_offset():
    assert to_utc("2023-11-05 10:00:00-0800") == datetime(2023, 11, 5, 18, 0, tzinfo=timezone.utc)


def test_garbage_offset_rejected():
    with pytest.raises(ValueError):
        parse_offset("+5")
