"""The independent ATIF validator lives in orchard.testing.atif_spec (the harness conformance suite runs it
for plug-in authors too); the tests import it from here as they always have."""

from orchard.testing.atif_spec import validate_atif

__all__ = ["validate_atif"]
