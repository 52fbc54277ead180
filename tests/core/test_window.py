"""Window selection (chat.core.window) and the token heuristic (chat.core.tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.core import tokens
from chat.core.messages import ChatMessage, Image, Role, ToolCall, assistant, system, user
from chat.core.window import (
    KEY_TOOLS,
    NO_NAMES_PLACEHOLDER,
    UnitKind,
    WindowLimits,
    assemble,
    choose_units,
    is_placeholder,
    limits_for_context_window,
    select_messages,
    units,
)
from tests.core.strategies import live_chats, run_live_chat

_ids = count(1)


def group(*names: str, result: str = "ok", results: int | None = None) -> list[ChatMessage]:
    """A tool-calling assistant message and one result per call (or ``results`` of them)."""
    calls = [ToolCall(id=f"call_{next(_ids)}", name=name, arguments="{}") for name in names]
    answered = len(calls) if results is None else results
    replies = [
        ChatMessage(role=Role.TOOL, content=result, tool_call_id=calls[i % len(calls)].id)
        for i in range(answered)
    ]
    return [ChatMessage(role=Role.ASSISTANT, tool_calls=calls), *replies]


def orphan(text: str = "stray") -> ChatMessage:
    return ChatMessage(role=Role.TOOL, content=text, tool_call_id=f"gone_{next(_ids)}")


class LengthEstimator:
    """Tokens = characters of content: makes budget arithmetic in tests readable."""

    def text_tokens(self, text: str) -> int:
        return len(text)

    def message_tokens(self, message: ChatMessage) -> int:
        return len(message.content)


@pytest.fixture
def length_tokens() -> Iterator[None]:
    previous = tokens.set_estimator(LengthEstimator())
    yield
    tokens.set_estimator(previous)


def contents(messages: list[ChatMessage]) -> list[str]:
    return [m.content for m in messages]


# --- token heuristic -------------------------------------------------------------------


def test_ascii_text_is_about_four_characters_per_token() -> None:
    assert tokens.estimate_text_tokens("") == 0
    assert tokens.estimate_text_tokens("abcd") == 1
    assert tokens.estimate_text_tokens("abcde") == 2
    assert tokens.estimate_text_tokens("x" * 400) == 100


def test_cjk_characters_count_one_token_each() -> None:
    assert tokens.estimate_text_tokens("你好世界") == 4
    assert tokens.estimate_text_tokens("こんにちは") == 5
    # 4 CJK + 8 ASCII characters (2 tokens)
    assert tokens.estimate_text_tokens("你好世界 abc def") == 4 + 2


def test_other_scripts_follow_their_utf8_width() -> None:
    # (3 × utf-8 bytes − characters) / 8, rounded up: 2-byte scripts ≈ 0.6, emoji ≈ 1.4.
    assert tokens.estimate_text_tokens("Привет") == 4  # (36 − 6) / 8 = 3.75
    assert tokens.estimate_text_tokens("😀😀") == 3  # (24 − 2) / 8 = 2.75
    assert tokens.estimate_text_tokens("\ud800") == 1  # a lone surrogate does not crash


def test_long_non_ascii_text_is_estimated_from_a_spread_sample() -> None:
    assert tokens.estimate_text_tokens("你" * 50_000) == 50_000
    mixed = "ab你" * 10_000  # exactly 1.5 tokens per 3 characters
    assert abs(tokens.estimate_text_tokens(mixed) - 15_000) <= 150
    half_cjk = "x" * 20_000 + "你" * 20_000  # the sample spans the whole text
    assert abs(tokens.estimate_text_tokens(half_cjk) - 25_000) <= 250


def test_message_estimate_counts_reasoning_tool_calls_and_images() -> None:
    base = tokens.estimate_message_tokens(assistant("abcd"))
    assert base == tokens.MESSAGE_OVERHEAD_TOKENS + 1
    thinking = assistant("abcd", reasoning_content="x" * 40)
    assert tokens.estimate_message_tokens(thinking) == base + 10
    calling = assistant("abcd", tool_calls=[ToolCall("c1", "read", '{"path": "a.py"}')])
    expected_call = tokens.TOOL_CALL_OVERHEAD_TOKENS + 1 + 4
    assert tokens.estimate_message_tokens(calling) == base + expected_call
    with_image = user("abcd", images=[Image("aGk=", "image/png")])
    assert tokens.estimate_message_tokens(with_image) == base + tokens.IMAGE_TOKENS
    assert tokens.estimate_tokens([thinking, calling]) == base * 2 + 10 + expected_call


def test_set_estimator_replaces_it_everywhere_and_returns_the_previous(length_tokens) -> None:
    assert tokens.estimate_text_tokens("abcdefgh") == 8
    assert tokens.estimate_tokens([user("abc"), user("de")]) == 5
    previous = tokens.set_estimator(tokens.HeuristicEstimator())
    assert isinstance(previous, LengthEstimator)
    assert tokens.estimate_text_tokens("abcdefgh") == 2
    tokens.set_estimator(previous)


# --- units --------------------------------------------------------------------------------


def test_units_parse_each_kind() -> None:
    tools = group("read", "write")
    messages = [
        system("rules"),
        user("hi"),
        assistant("hello"),
        *tools,
        ChatMessage(role="developer", content="unknown role"),
        assistant("calls nothing", tool_calls=[]),
        user("between"),
        orphan(),
        orphan(),
        user("bye"),
    ]
    parsed = units(messages)
    assert [(u.kind, u.start, u.end) for u in parsed] == [
        (UnitKind.SYSTEM, 0, 1),
        (UnitKind.USER, 1, 2),
        (UnitKind.ASSISTANT_TEXT, 2, 3),
        (UnitKind.TOOL_GROUP, 3, 6),
        (UnitKind.SYSTEM, 6, 7),
        (UnitKind.TOOL_GROUP, 7, 8),  # an empty tool_calls list still makes a group
        (UnitKind.USER, 8, 9),
        (UnitKind.TOOL_GROUP, 9, 11),  # the orphan run is one unit
        (UnitKind.USER, 11, 12),
    ]
    assert parsed[3].tool_names == ("read", "write")
    assert parsed[7].orphan and parsed[7].tool_names == ()
    assert not parsed[3].orphan
    assert sum(u.tokens for u in parsed) == tokens.estimate_tokens(messages)


def test_results_right_after_a_group_join_it_as_in_the_reference() -> None:
    messages = [orphan(), *group("a"), orphan(), user("u"), *group("b", results=0)]
    parsed = units(messages)
    assert [(u.start, u.end, u.orphan) for u in parsed] == [
        (0, 1, True),
        (1, 4, False),  # the stray result after the group's own result is absorbed
        (4, 5, False),
        (5, 6, False),  # a group whose results never came
    ]


# --- select_messages ------------------------------------------------------------------


def test_fast_path_returns_an_equal_new_list_with_the_same_objects() -> None:
    messages = [user("a"), *group("read"), assistant("b")]
    for limits in ({}, {"max_messages": 4}, {"max_tokens": 10_000}):
        selected = select_messages(messages, **limits)
        assert selected == messages
        assert selected is not messages
        assert all(a is b for a, b in zip(selected, messages, strict=True))


def test_recency_stage_stops_at_the_first_unit_that_does_not_fit(length_tokens) -> None:
    old_user, old_text = user("u" * 7), assistant("a" * 14)
    newest = user("n" * 10)
    messages = [old_user, old_text, *group("big", result="r" * 100), newest]
    # Stage 1 keeps the newest user, then stops at the 100-token group instead of going on
    # to the assistant text; stage 3 then spends the user quota (7 of 20) on the old user,
    # and the assistant text no longer fits in stage 4.
    selected = select_messages(messages, max_tokens=30)
    assert selected == [old_user, assistant("[Previous: used big]"), newest]


def test_recency_stage_covers_keep_recent_times_two_units() -> None:
    messages = [user("old"), *(assistant(f"a{i}") for i in range(6)), user("now")]
    # keep_recent=1: stage 1 keeps "now" and a5; the user quota (1 of 4) takes "old",
    # the assistant quota (1) a4, and overflow a3, a2.
    narrow = select_messages(messages, max_messages=6, keep_recent=1)
    assert contents(narrow) == ["old", "a2", "a3", "a4", "a5", "now"]
    # keep_recent=2: stage 1 keeps four units, the quotas of the 2 left round down to 0,
    # and overflow fills newest first, so the old request falls out.
    wide = select_messages(messages, max_messages=6, keep_recent=2)
    assert contents(wide) == ["a1", "a2", "a3", "a4", "a5", "now"]


def test_exempt_groups_are_kept_before_newer_ordinary_groups() -> None:
    first = user("first")
    delegated = group("delegate")
    read = group("read")
    big_delegated = group("delegate", results=4)
    recent = [assistant("latest"), user("now")]
    messages = [first, *delegated, *read, *big_delegated, *recent]
    # keep_recent=1 → stage 1 keeps the last two units (2 messages); stage 2 skips the
    # 5-message delegate group (does not fit in 5) but keeps the older 2-message one.
    selected = select_messages(messages, max_messages=5, keep_recent=1)
    assert selected == [
        first,
        *delegated,
        assistant("[Previous: used read, delegate]"),
        *recent,
    ]


def test_configured_exempt_tools_join_the_key_tools() -> None:
    assert "delegate" in KEY_TOOLS
    first = user("first")
    delegated, read, big_delegated = group("delegate"), group("read"), group("delegate", results=4)
    recent = [assistant("latest"), user("now")]
    messages = [first, *delegated, *read, *big_delegated, *recent]
    selected = select_messages(messages, max_messages=5, keep_recent=1, exempt_tools={"read"})
    assert selected == [
        first,
        assistant("[Previous: used delegate]"),
        *read,
        assistant("[Previous: used delegate]"),
        *recent,
    ]


def test_quota_splits_what_remained_before_stage_three() -> None:
    messages: list[ChatMessage] = []
    for index in range(10):
        messages += [user(f"u{index}"), assistant(f"a{index}")]
        if index % 2 == 0:
            messages += group(f"t{index}")
    parsed = units(messages)
    choice = choose_units(parsed, max_messages=20, keep_recent=0)
    kept = [u for u, keep in zip(parsed, choice.retained, strict=True) if keep]
    # 20 remaining → users floor(7.0)=7, assistant text floor(5.0)=5, tool groups 8 messages.
    kept_users = [messages[u.start].content for u in kept if u.kind == UnitKind.USER]
    kept_texts = [messages[u.start].content for u in kept if u.kind == UnitKind.ASSISTANT_TEXT]
    kept_groups = [u.tool_names[0] for u in kept if u.kind == UnitKind.TOOL_GROUP]
    assert kept_users == [f"u{i}" for i in range(3, 10)]
    assert kept_texts == [f"a{i}" for i in range(5, 10)]
    assert kept_groups == ["t2", "t4", "t6", "t8"]
    assert choice.forced_user is None


def test_quota_skips_a_unit_too_big_for_its_tier_and_tries_older_ones() -> None:
    small_old = group("small")
    huge_new = group("huge", results=8)  # 9 messages, over the 40 % tier of 10 (4 messages)
    messages = [user("u"), *small_old, *huge_new, user("now")]
    parsed = units(messages)
    choice = choose_units(parsed, max_messages=11, keep_recent=0)
    assert choice.retained == [True, True, False, True]


def test_overflow_fills_the_leftover_budget_newest_first() -> None:
    texts = [assistant(f"a{i}") for i in range(10)]
    newest = user("now")
    selected = select_messages([*texts, newest], max_messages=6, keep_recent=0)
    # Stage 3: user tier 2 (keeps "now"), assistant tier 1 (a9); stage 4 adds a8..a5.
    assert contents(selected) == ["a5", "a6", "a7", "a8", "a9", "now"]


def test_newest_user_is_forced_even_over_budget(length_tokens) -> None:
    old_user, reply = user("old"), assistant("reply")
    newest = user("N" * 500)
    messages = [old_user, reply, newest]
    parsed = units(messages)
    choice = choose_units(parsed, max_tokens=20)
    # The old user fits the quota, but the current request is what the model must see.
    assert choice.retained == [True, True, True]
    assert choice.forced_user == 2
    assert select_messages(messages, max_tokens=20) == messages


def test_newest_user_is_forced_when_nothing_else_fits(length_tokens) -> None:
    rules = system("S" * 50)
    messages = [rules, user("old"), assistant("x" * 10), user("N" * 100)]
    selected = select_messages(messages, max_tokens=40)
    # System units are always kept, even over budget; then nothing fits but the forced user.
    assert selected == [rules, messages[-1]]


def test_dropped_groups_merge_into_one_placeholder_with_names_in_order(length_tokens) -> None:
    old, middle, kept, now = user("old"), assistant("m" * 50), assistant("kept"), user("now")
    first = group("read", "write", result="r" * 30)
    second = group("read", result="r" * 30)
    messages = [old, *first, middle, *second, kept, now]
    # Stage 1 keeps "now" and "kept" (7 tokens); the user quota (4 of 13) takes "old";
    # the groups and the long assistant text never fit, so one placeholder covers the run.
    selected = select_messages(messages, max_tokens=20, keep_recent=1)
    assert selected == [old, assistant("[Previous: used read, write, read]"), kept, now]
    assert is_placeholder(selected[1])


def test_placeholders_do_not_merge_across_a_kept_unit() -> None:
    messages = [*group("a"), assistant("kept"), *group("b"), user("now")]
    selected = select_messages(messages, max_messages=2, keep_recent=0)
    assert contents(selected) == ["[Previous: used a]", "kept", "[Previous: used b]", "now"]


def test_dropped_orphans_leave_the_no_names_placeholder() -> None:
    messages = [orphan("x" * 10), orphan(), user("a"), assistant("b"), user("now")]
    selected = select_messages(messages, max_messages=3, keep_recent=5)
    assert contents(selected) == [NO_NAMES_PLACEHOLDER, "a", "b", "now"]
    assert is_placeholder(selected[0])


def test_an_orphan_run_is_emitted_once() -> None:
    strays = [orphan("one"), orphan("two")]
    now = user("now")
    messages = [*strays, *group("read", results=3), now]
    # The orphan run (2 messages) is counted once and fits in stage 4 next to "now".
    selected = select_messages(messages, max_messages=4)
    assert selected == [*strays, assistant("[Previous: used read]"), now]
    assert sum(m is strays[0] for m in selected) == 1


def test_window_limits_wraps_select_messages() -> None:
    messages = [user(str(i)) for i in range(30)]
    limits = WindowLimits(max_messages=5, keep_recent=1)
    assert limits.select(messages) == select_messages(messages, max_messages=5, keep_recent=1)


def test_limits_for_context_window_reserves_output_prompt_and_a_margin() -> None:
    assert limits_for_context_window(0, 4096) == 0  # unknown window: unlimited
    assert limits_for_context_window(128_000, 8_000) == 108_000
    assert limits_for_context_window(10_000, 2_000, reserve_for_prompt=3_000) == 4_500
    assert limits_for_context_window(4_000, 8_000) == 1  # never 0, which would mean unlimited
    limits = WindowLimits.for_context_window(32_000, 2_000, keep_recent=4, exempt_tools=["x"])
    assert limits == WindowLimits(max_tokens=27_000, keep_recent=4, exempt_tools=frozenset({"x"}))


# --- properties ---------------------------------------------------------------------------

TOOL_NAMES = ["read", "shell", "delegate", "search"]
contents_strategy = st.integers(0, 400).map(lambda size: "x" * size)


@st.composite
def conversations(draw: st.DrawFn) -> list[ChatMessage]:
    """Well-formed chats (complete tool groups) with occasional system messages and orphans."""
    messages: list[ChatMessage] = []
    serial = 0
    kinds = st.sampled_from(["user", "user", "text", "group", "group", "group", "system", "orphan"])
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(kinds)
        if kind == "user":
            messages.append(user(draw(contents_strategy)))
        elif kind == "text":
            messages.append(assistant(draw(contents_strategy)))
        elif kind == "system":
            messages.append(system(draw(st.sampled_from(["", "rules"]))))
        elif kind == "orphan":
            for _ in range(draw(st.integers(1, 2))):
                serial += 1
                messages.append(
                    ChatMessage(role=Role.TOOL, content="o", tool_call_id=f"orphan_{serial}")
                )
        else:
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                serial += 1
                calls.append(ToolCall(f"call_{serial}", draw(st.sampled_from(TOOL_NAMES)), "{}"))
            messages.append(assistant(draw(st.sampled_from(["", "checking"])), tool_calls=calls))
            for call in calls:
                messages.append(
                    ChatMessage(
                        role=Role.TOOL, content=draw(contents_strategy), tool_call_id=call.id
                    )
                )
    return messages


limits_strategy = st.fixed_dictionaries(
    {
        "max_messages": st.integers(0, 25),
        "max_tokens": st.sampled_from([0, 1, 20, 100, 300, 1000, 3000]),
        "keep_recent": st.integers(0, 6),
        "exempt_tools": st.sampled_from([frozenset(), frozenset({"shell"})]),
    }
)


def kept_positions(messages: list[ChatMessage], selected: list[ChatMessage]) -> list[int]:
    """Input positions of the non-placeholder output messages (matched by identity)."""
    position_of = {id(m): i for i, m in enumerate(messages)}
    return [position_of[id(m)] for m in selected if id(m) in position_of]


def check_selection(messages: list[ChatMessage], limits: dict) -> None:
    selected = select_messages(messages, **limits)
    positions = kept_positions(messages, selected)
    kept = set(positions)
    originals = {id(m) for m in messages}
    placeholders = [m for m in selected if id(m) not in originals]

    # Order is preserved and nothing is emitted twice.
    assert positions == sorted(set(positions))
    assert all(is_placeholder(m) for m in placeholders)
    # Placeholders are never adjacent: one per run of dropped groups.
    flags = [id(m) not in originals for m in selected]
    assert not any(a and b for a, b in zip(flags, flags[1:], strict=False))

    parsed = units(messages)
    for unit in parsed:  # never split a unit (a tool group with its results)
        inside = [i in kept for i in range(unit.start, unit.end)]
        assert all(inside) or not any(inside)

    # Every kept result's call is kept and every kept call has its results.
    kept_call_ids = {
        c.id for i in kept if messages[i].tool_calls for c in messages[i].tool_calls or []
    }
    for i in kept:
        message = messages[i]
        if message.role == Role.TOOL and not message.tool_call_id.startswith("orphan_"):
            assert message.tool_call_id in kept_call_ids
    kept_result_ids = {messages[i].tool_call_id for i in kept if messages[i].role == Role.TOOL}
    assert kept_call_ids <= kept_result_ids

    users = [i for i, m in enumerate(messages) if m.role == Role.USER]
    if users:
        assert users[-1] in kept
    assert all(i in kept for i, m in enumerate(messages) if m.role == Role.SYSTEM)

    # Within budget, except system units and the forced newest user.
    choice = choose_units(parsed, **limits)
    if choice.retained != [True] * len(parsed):  # not the fast path
        forced = parsed[choice.forced_user] if choice.forced_user is not None else None
        system_units = [u for u in parsed if u.kind == UnitKind.SYSTEM]
        used_messages = len(positions) - (forced.message_count if forced else 0)
        used_tokens = sum(u.tokens for u, k in zip(parsed, choice.retained, strict=True) if k)
        used_tokens -= forced.tokens if forced else 0
        if limits["max_messages"]:
            system_messages = sum(u.message_count for u in system_units)
            assert used_messages <= max(limits["max_messages"], system_messages)
        if limits["max_tokens"]:
            system_tokens = sum(u.tokens for u in system_units)
            assert used_tokens <= max(limits["max_tokens"], system_tokens)
        assembled = assemble(messages, parsed, choice.retained)
        assert kept_positions(messages, assembled) == positions

    # Idempotent whenever the first pass produced something within budget by itself.
    within = (not limits["max_messages"] or len(selected) <= limits["max_messages"]) and (
        not limits["max_tokens"] or tokens.estimate_tokens(selected) <= limits["max_tokens"]
    )
    if within:
        assert select_messages(selected, **limits) == selected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), limits_strategy)
def test_selection_properties(messages: list[ChatMessage], limits: dict) -> None:
    check_selection(messages, limits)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(live_chats(max_steps=14), limits_strategy)
def test_selection_properties_on_live_chat_contexts(script, limits: dict) -> None:
    # Contexts as the live channels build them: partial groups, empty ids, labelled messages.
    messages = run_live_chat(script).channels.context
    selected = select_messages(messages, **limits)
    positions = kept_positions(messages, selected)
    assert positions == sorted(set(positions))
    for unit in units(messages):
        inside = [i in set(positions) for i in range(unit.start, unit.end)]
        assert all(inside) or not any(inside)
    users = [i for i, m in enumerate(messages) if m.role == Role.USER]
    if users:
        assert users[-1] in positions


@settings(max_examples=100, deadline=None)
@given(conversations())
def test_unlimited_selection_is_the_identity(messages: list[ChatMessage]) -> None:
    assert select_messages(messages, max_messages=0, max_tokens=0) == messages
