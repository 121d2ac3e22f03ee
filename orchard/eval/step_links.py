"""Steps point at the gateway's records of the model calls that produced them."""

from __future__ import annotations

import logging
from typing import Any

from orchard.core.trajectory import LLMCall

log = logging.getLogger(__name__)


def link_steps_to_calls(steps: list[dict[str, Any]], calls: list[LLMCall]) -> list[dict[str, Any]]:
    """Step `llm_call_ids` as the gateway's call ids. A harness only sees the response body, so it may
    have recorded the response's `id` (as `extra["response_id"]` of an agent step); that is mapped to the
    call that returned it. Ids that match no recorded call are dropped (logged): a trajectory must not
    point at calls it does not hold."""
    known = {call.id for call in calls}
    by_response_id = {str(call.response.get("id")): call.id for call in calls
                      if call.response is not None and call.response.get("id")}
    for step in steps:
        linked = []
        given = step.get("llm_call_ids") or []
        if not given and step.get("source") == "agent" and (step.get("extra") or {}).get("response_id"):
            given = [str(step["extra"]["response_id"])]
        for call_id in given:
            target = call_id if call_id in known else by_response_id.get(call_id)
            if target is None:
                log.warning("step %s points at model call %r, which the gateway did not record; dropped",
                            step.get("step_id"), call_id)
            elif target not in linked:
                linked.append(target)
        step["llm_call_ids"] = linked
    return steps
