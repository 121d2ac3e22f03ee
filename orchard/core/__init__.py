"""Orchard's contracts: the data models, protocols and typed errors every other package is written
against (sandbox spec and `Sandbox` protocol, task, trajectory, ATIF, run status, harness protocol).

The I/O rule: nothing in `orchard.core` opens a network connection, starts a process, reads the
environment or touches a sandbox. The only I/O it does is

- reading and writing the on-disk formats it defines, at paths its caller passes in: JSON Lines of its
  models (`jsonl`) and task suites (`task_suite`), written atomically (`atomic_write`);
- reading installed packages' metadata to find plugins by entry point (`harness`).

Anything else (servers, clients, logging setup, file helpers) lives outside `orchard.core`; shared
helpers that are not contracts are in `orchard.util`."""
