"""The zero-code `cli` harness: any CLI agent that takes an OpenAI base URL, run inside the sandbox from a
harness bundle, its trajectory rebuilt from the gateway's records (harness.py)."""
