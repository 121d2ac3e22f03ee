"""Parse ISO-8601 style timestamps with explicit UTC offsets, as written by our log shippers."""
import re
from datetime import datetime, timedelta, timezone

_OFFSET_RE = re.compile(r"^(?P<sign>[+-])(?P<hours>\d{2}):?(?P<minutes>\d{2})$")
_STAMP_RE = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<time>\d{2}:\d{2}:\d{2})(?P<offset>Z|[+-]\d{2}:?\d{2})$")


def parse_offset(text):
    """Turn 'Z', '+05:30' or '-0800' into a fixed-offset timezone."""
    if text in ("Z", "z"):
        return timezone.utc
    match = _OFFSET_RE.match(text)
    if not match:
        raise ValueError("invalid UTC offset: %r" % text)
    hours = int(match.group("hours"))
    minutes = int(match.group("minutes"))
    if hours > 23 or minutes > 59:
        raise ValueError("UTC offset out of range: %r" % text)
    sign = -1 if match.group("sign") == "-" else 1
    return timezone(timedelta(hours=sign * hours, minutes=minutes))


def parse_timestamp(text):
    match = _STAMP_RE.match(text.strip())
    if not match:
        raise ValueError("not a timestamp: %r" % text)
    naive = datetime.strptime(match.group("date") + " " + match.group("time"), "%Y-%m-%d %H:%M:%S")
    return naive.replace(tzinfo=parse_offset(match.group("offset")))


def to_utc(text):
    return parse_timestamp(text).astimezone(timezone.utc)
