"""Sandbox backends, selected by name (see `registry.py`): a package each (`local/`, `kubernetes/`,
`docker/`); what several of them share sits here."""
