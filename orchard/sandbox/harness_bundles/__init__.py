"""Harness bundles: a harness's own Python and pinned environment, built once from Debian and PyPI and
mounted read-only at /.orchard/harness/<name> into any sandbox (docs/harness-bundles.md). `store` finds
built ones (what backends use), `build` makes them."""
