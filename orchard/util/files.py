"""The atomic writes moved to `orchard.core.atomic_write`: core writes its own formats with them, and core
imports nothing above it. These names stay here only until the last importers (orchard/sandbox/backends and
orchard/recipes, being reorganised) import them from core; import them from there."""

from orchard.core.atomic_write import atomic_write_bytes, atomic_write_text, fsync_directory

__all__ = ["atomic_write_bytes", "atomic_write_text", "fsync_directory"]
