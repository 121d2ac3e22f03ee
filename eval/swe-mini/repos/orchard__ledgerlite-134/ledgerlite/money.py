"""Amounts are stored as integer cents; parsing, formatting and splitting live here."""


def parse_amount(text):
    """'1,234.56' -> 123456 cents. Sub-cent digits (from FX conversions) round half up."""
    cleaned = text.strip().replace(",", "")
    try:
        value = float(cleaned)
    except ValueError:
        raise ValueError("not an amount: %r" % text) from None
    return int(value * 100)


def format_amount(cents):
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return "%s%s.%02d" % (sign, "{:,}".format(whole), frac)


def split_evenly(cents, parts):
    """Split into `parts` amounts that differ by at most one cent and add up to `cents`."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    share, remainder = divmod(cents, parts)
    return [share + 1 if i < remainder else share for i in range(parts)]
