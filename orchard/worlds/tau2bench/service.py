"""A tau2-bench domain's database as a Claw service (docs/claw.md, "tau2-bench airline"): tau2's own
environment (its toolkit on the database loaded from the installed package) behind the Claw world's HTTP
API (http_server.py), so that its tools are also the MCP tools of the Claw world's stdio proxy.

- actions: tau2's tools, by name, with tau2's own JSON Schemas (`GET /tools`); a call runs the tool as tau2's
  environment does (`make_tool_call`), its answer tau2's JSON of the result. A tool that raises (an unknown
  reservation, a payment refused, an argument missing) is a 400 whose error is tau2's message: tau2 shows the
  agent `Error: <message>` and the database is left as it was;
- state: `{"db_hash": ..., "db": ...}`, the hash tau2 grades by and the whole database;
- audit and reset as every Claw service has them (reset loads a fresh database).

The seed names the domain only (`{"domain": "airline"}`): the database is the package's, never copied into a
task. Runs in the sandbox with site-packages (tau2, pydantic), on Orchard's own interpreter."""

from __future__ import annotations

import json
import os

from ..claw.base import STATE_FILE, Fields, SeedError, Service
from .domain import DOMAINS, fresh_environment


class Tau2Domain(Service):
    name = "airline"
    description = "The airline's reservation system (tau2-bench's airline domain)."
    private_state = True  # tau2's agent sees the database only through its tools

    def state_from_seed(self, seed: dict) -> dict:
        f = Fields(seed, "tau2 seed", ("domain",))
        domain = f.text("domain", "airline")
        if domain not in DOMAINS:
            raise SeedError(f"tau2 seed.domain must be one of {', '.join(DOMAINS)}, not {domain!r}")
        self.domain, self.name = domain, domain
        self.environment = fresh_environment(domain)
        toolkit = self.environment.tools
        self._tools = {name: tool.openai_schema["function"] for name, tool in sorted(toolkit.get_tools().items())}
        self._reads = {name for name in self._tools if toolkit.tool_type(name) == "read"}  # no change to save
        return {}

    # The state is tau2's database itself, read when asked: a copy kept beside it would be 7 MB per change.
    @property
    def state(self) -> dict:
        return {"db_hash": self.environment.get_db_hash(),
                "db": self.environment.tools.db.model_dump(mode="json")}

    @state.setter
    def state(self, value) -> None:  # Service.__init__ and reset assign state_from_seed's answer: the environment
        pass

    def tools(self) -> list:
        return [{"name": name, "description": spec["description"], "inputSchema": spec["parameters"]}
                for name, spec in self._tools.items()]

    def describe(self) -> dict:
        return {"service": self.name, "description": self.description,
                "actions": {name: spec["description"] for name, spec in self._tools.items()},
                "endpoints": ["GET /health", "GET /tools", "GET /state (the grader's)", "GET /audit", "POST /reset",
                              "POST /<tool> with a JSON object of arguments"]}

    def call(self, name: str, arguments, via: str = "http"):
        """Run one of tau2's tools as tau2's environment does: (status, answer); every call audited."""
        if name not in self._tools:
            return 404, {"error": f"{self.name} has no tool {name!r}; its tools: {', '.join(self._tools)} "
                                  "(GET /tools describes them)"}
        if not isinstance(arguments, dict):
            return 400, {"error": f"{name} takes a JSON object of arguments"}
        with self.lock:
            try:
                result = self.environment.make_tool_call(name, **arguments)
                self.environment.sync_tools()
                text = self.environment.to_json_str(result)
                try:
                    status, answer = 200, json.loads(text)
                except ValueError:
                    status, answer = 200, text  # tau2 answers some tools with plain text
            except Exception as exc:  # noqa: BLE001 — tau2 turns any error of a tool into the agent's "Error: ..."
                status, answer = 400, {"error": str(exc) or type(exc).__name__}
            self._audit(name, arguments, status, answer, via, None)
            if status == 200 and name not in self._reads:
                self.save()
        return status, answer

    def save(self) -> None:
        """Only the hash: the grader asks the service; the database is 7 MB (`GET /state` gives it)."""
        if not self.state_dir:
            return
        path = os.path.join(self.state_dir, STATE_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"db_hash": self.environment.get_db_hash()}, f)
        os.replace(path + ".tmp", path)
