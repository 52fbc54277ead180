"""Micro compaction and the auto-compaction helpers (chat.core.compact)."""

from __future__ import annotations

import json
from itertools import count

import pytest

from chat.core import tokens
from chat.core.compact import (
    COMPACT_KEEP_RECENT_USER,
    COMPACT_TOOL_NAME,
    DEFAULT_AUTO_COMPACT_THRESHOLD,
    EMPTY_SUMMARY,
    MICRO_COMPACT_MIN_CHARS,
    PROTECTED_CONTEXT_HEADER,
    SUMMARY_INPUT_MAX_CHARS,
    CompactionResult,
    auto_compact,
    auto_compact_threshold,
    build_summary_request,
    compacted_context,
    micro_compact,
    needs_auto_compact,
)
from chat.core.eventlog import sanitize
from chat.core.messages import ChatMessage, Role, ToolCall, assistant, tool_result, user
from chat.core.window import KEY_TOOLS, limits_for_context_window, select_messages

_ids = count(1)
BIG = "b" * (MICRO_COMPACT_MIN_CHARS + 1)


def call_and_result(name: str, result: str) -> list[ChatMessage]:
    call_id = f"call_{next(_ids)}"
    return [
        assistant(tool_calls=[ToolCall(call_id, name, "{}")]),
        tool_result(call_id, result),
    ]


def tool_contents(messages: list[ChatMessage]) -> list[str]:
    return [m.content for m in messages if m.role == Role.TOOL]


# --- micro_compact ----------------------------------------------------------------------


def test_old_large_results_become_placeholders_and_recent_ones_stay() -> None:
    messages = [
        user("go"),
        *call_and_result("shell", BIG),
        *call_and_result("read", BIG),
        *call_and_result("read", BIG),
    ]
    compacted, replaced = micro_compact(messages, keep_recent=1)
    assert replaced == 2
    assert tool_contents(compacted) == ["[Previous: used shell]", "[Previous: used read]", BIG]


def test_results_at_the_threshold_are_kept() -> None:
    at_limit = "x" * MICRO_COMPACT_MIN_CHARS
    messages = [*call_and_result("shell", at_limit), *call_and_result("shell", "new")]
    compacted, replaced = micro_compact(messages, keep_recent=1)
    assert replaced == 0
    assert compacted == messages


def test_nothing_changes_with_at_most_keep_recent_results() -> None:
    messages = [*call_and_result("shell", BIG), *call_and_result("shell", BIG)]
    assert micro_compact(messages, keep_recent=2) == (messages, 0)
    _, replaced = micro_compact(messages, keep_recent=0)
    assert replaced == 2


def test_exempt_tools_are_never_compacted() -> None:
    messages = [
        *call_and_result("delegate", BIG),
        *call_and_result("compact", BIG),
        *call_and_result("search", BIG),
        *call_and_result("shell", BIG),
        *call_and_result("shell", "latest"),
    ]
    compacted, replaced = micro_compact(messages, keep_recent=1, exempt_tools={"search"})
    assert replaced == 1
    assert tool_contents(compacted) == [BIG, BIG, BIG, "[Previous: used shell]", "latest"]


def test_results_without_a_known_call_are_named_unknown() -> None:
    messages = [tool_result("vanished", BIG), *call_and_result("shell", "latest")]
    compacted, replaced = micro_compact(messages, keep_recent=1)
    assert replaced == 1
    assert compacted[0].content == "[Previous: used unknown]"
    assert compacted[0].tool_call_id == "vanished"


def test_micro_compact_never_mutates_its_input() -> None:
    messages = [*call_and_result("shell", BIG), *call_and_result("shell", "latest")]
    snapshot = [m.copy() for m in messages]
    original_list = list(messages)
    compacted, _ = micro_compact(messages, keep_recent=1)
    assert messages == snapshot
    assert all(a is b for a, b in zip(messages, original_list, strict=True))
    assert compacted is not messages
    assert compacted[0] is messages[0]  # untouched messages are shared, replaced ones copied
    assert compacted[1] is not messages[1]


def test_only_tool_results_are_compacted() -> None:
    messages = [user(BIG), assistant(BIG), *call_and_result("shell", "x"), user("now")]
    assert micro_compact(messages, keep_recent=0) == (messages, 0)


# --- threshold ------------------------------------------------------------------------------


def test_needs_auto_compact_uses_the_shared_estimate() -> None:
    messages = [user("x" * 400), assistant("y" * 400)]
    estimate = tokens.estimate_tokens(messages)
    assert needs_auto_compact(messages, estimate - 1)
    assert not needs_auto_compact(messages, estimate)
    assert not needs_auto_compact(messages, 0)  # disabled


def test_auto_compact_threshold_sits_below_the_window_budget() -> None:
    budget = limits_for_context_window(128_000, 8_000)
    assert auto_compact_threshold(128_000, 8_000) == budget * 80 // 100
    assert auto_compact_threshold(0, 8_000) == DEFAULT_AUTO_COMPACT_THRESHOLD


# --- summary request ----------------------------------------------------------------------


def test_summary_request_is_one_user_message_with_the_sections_and_the_json() -> None:
    messages = [
        user("Please fix the bug", extra={"run": "r1"}),
        *call_and_result("read", "def f(): ..."),
    ]
    request = build_summary_request(messages, None)
    assert len(request) == 1 and request[0].role == Role.USER
    text = request[0].content
    headings = [
        "Primary Request",
        "Key Concepts",
        "Files and Code",
        "Errors and Fixes",
        "Problem Solving",
        "Active Workflows",
        "Pending Tasks",
        "Current Work",
        "Next Step",
    ]
    positions = [text.index(heading) for heading in headings]
    assert positions == sorted(positions)
    conversation = json.loads(text[text.index("[{") :])
    assert conversation[0] == {"role": "user", "content": "Please fix the bug"}  # no extra
    assert conversation[1]["tool_calls"][0]["name"] == "read"
    assert PROTECTED_CONTEXT_HEADER not in text


def test_summary_request_truncates_the_conversation_and_appends_protected_context() -> None:
    messages = [user("x" * 50_000), user("y" * 50_000)]
    text = build_summary_request(messages, "Keep the TODO list verbatim.")[0].content
    start = text.index("[{")
    end = text.index("\n\n" + PROTECTED_CONTEXT_HEADER)
    assert end - start == SUMMARY_INPUT_MAX_CHARS
    assert text.endswith(f"{PROTECTED_CONTEXT_HEADER}\nKeep the TODO list verbatim.")


# --- compacted context ----------------------------------------------------------------


def conversation_with_users(total: int) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for index in range(total):
        messages += [user(f"u{index}"), *call_and_result("shell", "out"), assistant(f"a{index}")]
    return messages


def test_compacted_context_keeps_the_last_users_then_a_complete_compact_pair() -> None:
    messages = conversation_with_users(8)
    new = compacted_context(messages, "  SUMMARY TEXT \n")
    users = new[:COMPACT_KEEP_RECENT_USER]
    assert [m.content for m in users] == ["u3", "u4", "u5", "u6", "u7"]
    call_message, result = new[COMPACT_KEEP_RECENT_USER:]
    assert call_message.role == Role.ASSISTANT and call_message.tool_calls is not None
    (call,) = call_message.tool_calls
    assert call.name == COMPACT_TOOL_NAME
    assert call.id == f"compact_{len(messages)}"
    assert json.loads(call.arguments) == {"reason": "auto_compact"}
    assert result.role == Role.TOOL and result.tool_call_id == call.id
    assert result.content.endswith("\n\nSUMMARY TEXT")
    assert f"{len(messages)} messages" in result.content
    # Valid for strict providers: sanitize (orphan removal) changes nothing.
    assert sanitize(new) == new


def test_compacted_context_with_few_users_and_an_empty_summary() -> None:
    messages = conversation_with_users(2)
    new = compacted_context(messages, "   ")
    assert [m.content for m in new[:2]] == ["u0", "u1"]
    assert new[-1].content.endswith(EMPTY_SUMMARY)
    assert len(new) == 4


def test_the_compact_tool_is_a_key_tool() -> None:
    assert COMPACT_TOOL_NAME in KEY_TOOLS


def test_the_summary_survives_later_micro_compaction_and_window_selection() -> None:
    summary = "S" * 5_000
    context = compacted_context(conversation_with_users(6), summary)
    for index in range(30):
        context += [user(f"later {index}"), *call_and_result("shell", BIG)]
    compacted, _ = micro_compact(context, keep_recent=3)
    assert any(m.content.endswith(summary) for m in compacted)
    selected = select_messages(compacted, max_messages=20, keep_recent=2)
    kept_summary = [m for m in selected if m.role == Role.TOOL and m.content.endswith(summary)]
    assert len(kept_summary) == 1
    assert sanitize(selected) == selected


# --- auto_compact -------------------------------------------------------------------------


async def test_auto_compact_sends_the_request_and_builds_the_result() -> None:
    messages = conversation_with_users(7)
    seen: list[list[ChatMessage]] = []

    async def summarize(request: list[ChatMessage]) -> str:
        seen.append(request)
        return " the summary "

    result = await auto_compact(messages, summarize, protected_context="keep me")
    assert seen == [build_summary_request(messages, "keep me")]
    assert isinstance(result, CompactionResult)
    assert result.messages_before == len(messages)
    assert result.summary == "the summary"
    assert result.new_messages == compacted_context(messages, "the summary")
    assert [m.content for m in result.recent_user_messages] == ["u2", "u3", "u4", "u5", "u6"]


async def test_auto_compact_reports_an_empty_summary_and_propagates_errors() -> None:
    async def empty(_: list[ChatMessage]) -> str:
        return ""

    result = await auto_compact([user("hi")], empty)
    assert result.summary == EMPTY_SUMMARY

    async def failing(_: list[ChatMessage]) -> str:
        raise RuntimeError("provider down")

    with pytest.raises(RuntimeError, match="provider down"):
        await auto_compact([user("hi")], failing)
