"""Small helpers every layer of Orchard shares, one copy each: atomic file writes (`files`), user config
files (`config_files`), environment flags (`env`), lazy package exports (`lazy`), logging setup (`logs`),
serving an ASGI app from a thread (`uvicorn_thread`) and the JSON error responses of Orchard's HTTP
services (`http_errors`).

The rule: a module here imports the standard library, third-party packages (each only where it is used)
and at most `orchard.core`'s contracts — never the sandbox, gateway, evaluator or recipe packages, so any
of them may use it without tying itself to another."""
