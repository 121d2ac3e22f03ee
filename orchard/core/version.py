"""Orchard's version, as written in the source tree (pyproject.toml's `version` is the same; an installed
orchard's metadata is what `orchard.core.harness.orchard_version` reads first). In core, so that core reads
it without importing the package root above it; `orchard.__version__` is this."""

VERSION = "0.1.0"
