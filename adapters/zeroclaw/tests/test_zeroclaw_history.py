"""The profile's history cap (profile/history.py) on conversations made up here."""

from __future__ import annotations

from orchard_zeroclaw.profile.history import BREADCRUMB, trim_history, without_orphans

SYSTEM = {"role": "system", "content": "s"}
TASK = {"role": "user", "content": "the task"}


def turn(n: int) -> list[dict]:
    answer = {"id": f"c{n}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    return [{"role": "assistant", "content": f"a{n}", "tool_calls": [answer]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"r{n}"}]


def conversation(turns: int) -> list[dict]:
    return [SYSTEM, TASK] + [m for n in range(1, turns + 1) for m in turn(n)]


def test_a_conversation_within_the_limit_is_left_alone():
    assert trim_history(conversation(2), 50) is None
    assert trim_history(conversation(2), 5) is None  # the task and four messages


def test_the_middle_goes_the_task_stays_and_the_breadcrumb_marks_the_cut():
    trim = trim_history(conversation(30), 50)  # 61 messages past the system prompt
    assert trim is not None
    kept = trim.messages
    assert kept[:3] == [SYSTEM, TASK, {"role": "user", "content": BREADCRUMB}]
    assert kept[3]["role"] == "assistant" and kept[-1] == turn(30)[1]
    assert len(kept) - 1 <= 50 // 2 + 2 and trim.dropped_messages == 60 - (len(kept) - 3)  # the rest past the task
    assert trim.kept == [TASK, *kept[3:]]
    assert trim.frame() == {"type": "history_trimmed", "dropped_messages": trim.dropped_messages, "kept_turns": 1,
                            "reason": "message limit"}
    assert trim_history(trim.messages, 50) is None  # the next cut is half the limit away


def test_no_tool_result_is_kept_without_its_call():
    trim = trim_history(conversation(4), 4)
    assert [m["role"] for m in trim.messages[3:]] == ["assistant", "tool"]
    assert without_orphans([turn(1)[1], *turn(2)]) == turn(2)
