"""Read and write .env files (KEY=value lines, double-quoted values with backslash escapes)."""
import re

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BARE_VALUE = re.compile(r"^[A-Za-z0-9_./:@+-]*$")
_ESCAPES = {"n": "\n", '"': '"', "\\": "\\", "$": "$"}


def dumps(values):
    lines = []
    for key in sorted(values):
        if not _KEY.match(key):
            raise ValueError("invalid variable name: %r" % key)
        value = values[key]
        if _BARE_VALUE.match(value):
            lines.append("%s=%s" % (key, value))
        else:
            lines.append('%s="%s"' % (key, value))
    return "".join(line + "\n" for line in lines)


def loads(text):
    result = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):]
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ValueError("line %d: expected KEY=value, got %r" % (number, raw))
        value = value.strip()
        if value.startswith('"'):
            result[key] = _unquote(value, number)
        else:
            result[key] = value.split(" #", 1)[0].rstrip()
    return result


def _unquote(value, number):
    out, i = [], 1
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value):
            out.append(_ESCAPES.get(value[i + 1], "\\" + value[i + 1]))
            i += 2
        elif ch == '"':
            return "".join(out)
        else:
            out.append(ch)
            i += 1
    raise ValueError("line %d: unterminated quoted value" % number)
