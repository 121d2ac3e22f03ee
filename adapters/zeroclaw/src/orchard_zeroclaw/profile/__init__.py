"""The ZeroClaw profile: ZeroClaw 0.8.4's tools (schemas.py, tools.py, text.py), system-prompt layout (prompt.py),
history cap (history.py) and delegated sub-agents, as an agent loop in Orchard's process (agent.py)."""
