"""Orchard's in-sandbox agent: a standard-library-only HTTP server (Python >= 3.8) that runs commands,
persistent shells and file transfers inside a sandbox. Its wire protocol is docs/agent-protocol.md.

It is copied into sandboxes as a package of its own, so its modules import each other relatively and
nothing of Orchard."""

VERSION = "0.1.0"
