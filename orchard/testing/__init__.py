"""Test doubles and suites for Orchard and for third-party plug-ins; not used in production code paths."""
