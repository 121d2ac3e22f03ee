from .spec import max_satisfying, parse_version, satisfies_caret

__all__ = ["max_satisfying", "parse_version", "satisfies_caret"]
