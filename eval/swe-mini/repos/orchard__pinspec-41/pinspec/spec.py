"""Release versions and caret pins (^1.4.5 means >=1.4.5 and <2.0.0) as used in our lock files."""


def parse_version(text):
    parts = text.strip().lstrip("v").split(".")
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        raise ValueError("not a release version: %r" % text)
    numbers = [int(part) for part in parts]
    while len(numbers) < 3:
        numbers.append(0)
    return tuple(numbers)


def satisfies_caret(candidate, pinned):
    """True if `candidate` is allowed by `^pinned`: same major version, and not older than the pin."""
    c_major, c_minor, c_patch = parse_version(candidate)
    p_major, p_minor, p_patch = parse_version(pinned)
    return c_major == p_major and c_minor > p_minor or c_minor == p_minor and c_patch >= p_patch


def max_satisfying(candidates, pinned):
    """The newest candidate allowed by `^pinned`, or None."""
    allowed = [c for c in candidates if satisfies_caret(c, pinned)]
    return max(allowed, key=parse_version) if allowed else None
