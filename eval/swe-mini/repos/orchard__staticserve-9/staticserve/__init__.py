from .paths import Forbidden, file_for, resolve

__all__ = ["Forbidden", "file_for", "resolve"]
