"""The OpenHands SDK (PyPI `openhands-sdk`, `openhands-tools`), run inside the sandbox from its harness bundle
(bundle.py); the adapter that drives it comes with the in-sandbox harnesses."""
