"""The real ZeroClaw binary inside the task's sandbox: its gateway started by a small driver (driver.py, run
with the harness bundle's Python), its `custom` provider at the Orchard gateway (config.py), the task sent over
`/ws/chat`, and the frames it answers with turned into the trajectory (frames.py)."""
