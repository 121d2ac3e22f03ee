"""Reading a configuration file a user wrote: JSON, or YAML by its suffix (.yaml/.yml), into a mapping,
with errors that name the file and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard.core.errors import InvalidRequest, NotFound


def read_config_file(path: str | Path, what: str) -> dict[str, Any]:
    """The mapping in `path`; `what` names it in errors (e.g. "gateway config")."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise NotFound(f"{what} {path} does not exist") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{what} {path} is not a text file: {exc}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml  # a dependency of litellm, so always installed

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise InvalidRequest(f"{what} {path} is not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidRequest(f"{what} {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"{what} {path} must hold a mapping of settings, not {type(data).__name__}")
    return data
