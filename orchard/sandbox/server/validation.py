"""Where the orchestrator's service imports its validation-error formatter from; the one formatter is
`orchard.core.errors.describe_validation_errors`."""

from __future__ import annotations

from orchard.core.errors import describe_validation_errors

__all__ = ["describe_validation_errors"]
