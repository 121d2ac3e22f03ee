"""Models that run inside Orchard itself, served by the gateway under plain model names so their calls are
recorded like any provider's. Each is a Policy (orchard/core/policy.py) registered in the `orchard.models`
entry-point group and found through registry.py; the built-in ones:

- `oracle` (oracle.py): plays a task's reference patch through the harness's own tools, to check that a
  harness, its sandbox and the grader agree before a real model is spent on them.
- `smollm2` (smollm2/): SmolLM2-135M-Instruct, the embedded default model, run with transformers on CPU,
  with token ids and logprobs for every completion.

Policies served at run time (live.py, e.g. the model being trained) are found beside them. Nothing heavy
is imported here: torch and transformers load on the first `smollm2` call."""
