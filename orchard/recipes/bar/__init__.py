"""BAR — Balanced Adaptive Rollout: how many rollouts each prompt gets in GRPO-style RL, and which of them
form its training group. Pure Python (no torch): the same allocator drives `orchard train rl`, the
benchmark on simulated pass rates and any other rollout loop.

A group whose rollouts all got the same reward has zero advantage everywhere: its rollouts were spent for
nothing. Three allocators share one API, so they can be compared on the same prompts:

- `FixedGroupAllocator` — plain GRPO: `group_size` rollouts per prompt, every group kept (informative or
  not).
- `DynamicSamplingAllocator` — DAPO's zero-variance filter (dynamic sampling): `group_size` rollouts per
  prompt, groups whose rewards all agree are dropped, and further prompts are drawn until `batch_groups`
  informative groups are built.
- `BalancedAllocator` — BAR: each prompt is sampled in small rounds; it stops as soon as it holds
  `group_size // 2` positive and as many negative rollouts (the group is built from exactly those: equal
  positive and negative counts); a prompt whose rollouts all agree after `retire_after` rollouts is retired
  (all-pass or all-fail: no signal for this policy); a prompt that reaches `max_rollouts` with both rewards
  but not enough of one gives a group of every rollout of the scarcer reward filled up to `group_size`
  with the commoner one (Reinforce-Ada's fallback; `fill_group=False`: `min(pos, neg)` of each).

The loop is the same for all three:

    allocator = BalancedAllocator(prompt_ids, batch_groups=8, config=BarConfig(group_size=8))
    while not allocator.done:
        for request in allocator.next_requests():          # (prompt_id, how many rollouts)
            for _ in range(request.count):
                allocator.record(request.prompt_id, reward, rollout_id=handle)   # or error="..."
    groups = allocator.groups()                              # TrainingGroup: prompt_id + chosen rollouts

Across the steps of a run, BAR keeps a `PromptHistory`: a prompt retired as all-pass/all-fail is not drawn
again, and rollouts of earlier steps that agree count towards a prompt's retirement. That memory is where
most of the savings on a U-shaped pass-rate distribution come from, so bench/rl_wasted_rollouts.py compares
BAR with DAPO given the same memory, at an equal rollout budget.

The training group need not carry its own baseline: `graded(prompt_id)` is every reward the prompt got in
the step, which the advantage is centred on (orchard.recipes.rl.baseline).

A rollout that ended in an infrastructure error (the sandbox, the model API, the grader failed) is recorded
with `error=`: it is counted as spent, never as a reward (a fake 0 would bias the group's baseline). BAR
asks for a replacement; the fixed and DAPO allocators leave the group one rollout short, as GRPO
implementations mask such rollouts. A prompt with `max_errors` errors is retired as broken.

Modules: `config.py` (`BarConfig`), `records.py` (results, groups, `PromptHistory`), `allocator.py` (the
shared machinery, `drive`), `strategies.py` (the three allocators, `make_allocator`); `simulation.py` and
`learning.py` run them on simulated pass rates."""
