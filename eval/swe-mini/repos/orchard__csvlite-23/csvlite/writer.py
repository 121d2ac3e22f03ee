"""A minimal RFC 4180 writer for streaming exports: always CRLF, quotes only when needed."""

# Characters that force a field to be quoted.
_NEEDS_QUOTES = (",", "\r", "\n")


def format_field(value):
    if value is None:
        return ""
    text = str(value)
    if any(ch in text for ch in _NEEDS_QUOTES):
        return '"' + text + '"'
    return text


def format_row(values):
    return ",".join(format_field(v) for v in values) + "\r\n"


def write_rows(stream, rows, header=None):
    """Write `header` (if given) and each row to `stream`; return the number of data rows."""
    if header is not None:
        stream.write(format_row(header))
    count = 0
    for row in rows:
        stream.write(format_row(row))
        count += 1
    return count
