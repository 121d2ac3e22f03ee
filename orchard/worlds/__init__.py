"""Worlds: programs a task brings into its sandbox for the agent to act on — services with an action log
and state that graders read (claw/: mail, calendar, contacts, notes, todo). What runs inside a sandbox
imports nothing but the standard library (docs/claw.md)."""
