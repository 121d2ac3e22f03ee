"""Sandbox backends, selected by name (see `registry.py`)."""
