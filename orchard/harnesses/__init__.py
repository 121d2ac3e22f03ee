"""Harness adapters: Orchard's own ReAct tool-calling harness (`react`) and the real mini-swe-agent package
driven on an Orchard sandbox (`mini_swe_agent`). Both are registered as entry points in the
`orchard.harnesses` group; find them with `orchard.core.harness.get_harness(name)`, never by import."""
