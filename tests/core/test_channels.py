"""Writing rules of the live channels, including hold-back while a tool group is open."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from chat.core.channels import (
    LiveChannels,
    open_tool_call_ids,
    strip_agent_xml_tag,
    wrap_for_context,
)
from chat.core.messages import ChatMessage, Role, ToolCall, assistant, tool_result, user
from tests.core.strategies import LiveChatScript, live_chats, run_live_chat


def calls(*ids: str) -> list[ToolCall]:
    return [ToolCall(id=call_id, name="search", arguments="{}") for call_id in ids]


def sub_agent(text: str, sender: str = "SubAgent@x") -> ChatMessage:
    return assistant(text, sender_name=sender)


def contents(messages: list[ChatMessage]) -> list[str]:
    return [m.content for m in messages]


# --- push_both -------------------------------------------------------------------------


def test_push_both_puts_equal_messages_in_both_channels():
    channels = LiveChannels()
    message = assistant("hello", reasoning_content="think", extra={"run": "r1"})
    channels.push_both(message)
    assert channels.context == [message]
    assert channels.display == [message]
    assert channels.context[0] is message
    assert channels.display[0] is not message


def test_push_both_display_is_an_independent_copy():
    channels = LiveChannels()
    channels.push_both(assistant("c", tool_calls=calls("a"), extra={"run": "r1"}))
    shown, sent = channels.display[0], channels.context[0]
    shown.content = "edited"
    shown.extra["seq"] = 3
    shown.tool_calls.append(ToolCall(id="b", name="x", arguments="{}"))
    assert sent.content == "c"
    assert sent.extra == {"run": "r1"}
    assert [c.id for c in sent.tool_calls] == ["a"]
    sent.content = "other"
    assert shown.content == "edited"


# --- push_labelled ---------------------------------------------------------------------


def test_push_labelled_clean_in_display_wrapped_in_context():
    channels = LiveChannels()
    channels.push_labelled(sub_agent("found it", sender="SubAgent@search"))
    assert channels.display == [sub_agent("found it", sender="SubAgent@search")]
    assert channels.context == [
        sub_agent("<SubAgent@search>found it</SubAgent@search>", sender="SubAgent@search")
    ]


def test_push_labelled_keeps_extra_in_display_only():
    channels = LiveChannels()
    channels.push_labelled(assistant("hi", sender_name="Bob", extra={"run": "r1"}))
    assert channels.display[0].extra == {"run": "r1"}
    assert channels.context[0].extra == {}


def test_push_labelled_does_not_double_wrap():
    channels = LiveChannels()
    channels.push_labelled(sub_agent("<Bob>hi</Bob>", sender="Bob"))
    assert contents(channels.display) == ["hi"]
    assert contents(channels.context) == ["<Bob>hi</Bob>"]


def test_push_labelled_keeps_role_of_teacher_message():
    channels = LiveChannels()
    channels.push_labelled(user("stop here", sender_name="Ms Rivera"))
    assert channels.context[0].role == Role.USER
    assert channels.context[0].content == "<Ms Rivera>stop here</Ms Rivera>"


@pytest.mark.parametrize("sender", [None, ""])
def test_push_labelled_without_sender_raises(sender: str | None):
    channels = LiveChannels()
    with pytest.raises(ValueError):
        channels.push_labelled(assistant("x", sender_name=sender))
    assert channels.context == channels.display == channels.held == []


def test_wrap_for_context():
    assert wrap_for_context("Teammate@A", "x") == "<Teammate@A>x</Teammate@A>"


# --- strip_agent_xml_tag ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("<X>text</X>", "text"),
        ("<X> text </X>", " text "),  # not trimmed
        ("<X></X>", ""),
        ("<X><X>a</X></X>", "<X>a</X>"),  # one layer only
        ("<X>text</Y>", "<X>text</Y>"),
        ("<Y>text</X>", "<Y>text</X>"),
        ("<Y>text</Y>", "<Y>text</Y>"),
        (" <X>text</X>", " <X>text</X>"),
        ("<X>text</X> ", "<X>text</X> "),
        ("<X>text", "<X>text"),
        ("text</X>", "text</X>"),
        ("<X>", "<X>"),
        ("</X>", "</X>"),
        ("<x>text</x>", "<x>text</x>"),  # case sensitive
        ("plain", "plain"),
        ("", ""),
    ],
)
def test_strip_agent_xml_tag(content: str, expected: str):
    assert strip_agent_xml_tag("X", content) == expected


def test_strip_agent_xml_tag_with_sender_label_characters():
    sender = "SubAgent@search_auth…"
    assert strip_agent_xml_tag(sender, f"<{sender}>[已完成]</{sender}>") == "[已完成]"


# --- open tool groups ------------------------------------------------------------------


def test_open_tool_call_ids_of_trailing_group():
    request = assistant(tool_calls=calls("a", "b"))
    assert open_tool_call_ids([]) == set()
    assert open_tool_call_ids([user("x")]) == set()
    assert open_tool_call_ids([request]) == {"a", "b"}
    assert open_tool_call_ids([request, tool_result("b", "")]) == {"a"}
    assert open_tool_call_ids([request, tool_result("b", ""), tool_result("a", "")]) == set()
    assert open_tool_call_ids([assistant(tool_calls=[])]) == set()


def test_open_tool_call_ids_only_looks_at_the_trailing_group():
    history = [assistant(tool_calls=calls("a")), user("moved on")]
    assert open_tool_call_ids(history) == set()
    assert open_tool_call_ids([*history, assistant(tool_calls=calls("c"))]) == {"c"}


def test_open_tool_call_ids_counts_repeated_ids():
    # Providers without call ids give every call the id "": one result answers one call.
    request = assistant(tool_calls=calls("", ""))
    assert open_tool_call_ids([request, tool_result("", "")]) == {""}
    assert open_tool_call_ids([request, tool_result("", ""), tool_result("", "")]) == set()


def test_a_result_for_another_id_does_not_close_the_group():
    request = assistant(tool_calls=calls("a"))
    assert open_tool_call_ids([request, tool_result("zzz", "")]) == {"a"}


# --- hold-back -------------------------------------------------------------------------


def test_labelled_message_during_open_group_is_held_until_the_last_result():
    channels = LiveChannels()
    request = assistant(tool_calls=calls("a"))
    channels.push_both(request)
    assert channels.tool_group_open
    channels.push_labelled(sub_agent("working"))
    assert contents(channels.display) == ["", "working"]
    assert channels.context == [request]
    assert contents(channels.held) == ["<SubAgent@x>working</SubAgent@x>"]
    channels.push_both(tool_result("a", "done"))
    assert contents(channels.context) == ["", "done", "<SubAgent@x>working</SubAgent@x>"]
    assert channels.held == []
    assert not channels.tool_group_open
    assert contents(channels.display) == ["", "working", "done"]


def test_hold_back_with_several_calls_waits_for_every_result():
    channels = LiveChannels()
    channels.push_both(assistant(tool_calls=calls("a", "b", "c")))
    channels.push_labelled(sub_agent("one"))
    channels.push_both(tool_result("b", "rb"))
    channels.push_labelled(sub_agent("two", sender="Teammate@Y"))
    channels.push_both(tool_result("a", "ra"))
    assert contents(channels.context) == ["", "rb", "ra"]
    assert len(channels.held) == 2
    channels.push_both(tool_result("c", "rc"))
    assert contents(channels.context) == [
        "",
        "rb",
        "ra",
        "rc",
        "<SubAgent@x>one</SubAgent@x>",
        "<Teammate@Y>two</Teammate@Y>",
    ]
    assert channels.held == []
    assert contents(channels.display) == ["", "one", "rb", "two", "ra", "rc"]


def test_hold_back_with_calls_without_ids():
    channels = LiveChannels()
    channels.push_both(assistant(tool_calls=calls("", "")))
    channels.push_labelled(sub_agent("note"))
    channels.push_both(tool_result("", "r1"))
    assert contents(channels.context) == ["", "r1"]
    channels.push_both(tool_result("", "r2"))
    assert contents(channels.context) == ["", "r1", "r2", "<SubAgent@x>note</SubAgent@x>"]


def test_no_hold_when_the_group_is_closed():
    channels = LiveChannels()
    channels.push_both(assistant(tool_calls=calls("a")))
    channels.push_both(tool_result("a", "r"))
    channels.push_labelled(sub_agent("after"))
    assert contents(channels.context) == ["", "r", "<SubAgent@x>after</SubAgent@x>"]
    assert channels.held == []


def test_no_hold_for_assistant_with_empty_tool_calls():
    channels = LiveChannels()
    channels.push_both(assistant("x", tool_calls=[]))
    channels.push_labelled(sub_agent("hi"))
    assert contents(channels.context) == ["x", "<SubAgent@x>hi</SubAgent@x>"]


def test_held_messages_keep_their_order_behind_a_new_group():
    channels = LiveChannels()
    channels.push_both(assistant(tool_calls=calls("a")))
    channels.push_labelled(sub_agent("first"))
    channels.push_both(tool_result("a", "r"))
    channels.push_both(assistant(tool_calls=calls("b")))
    channels.push_labelled(sub_agent("second"))
    channels.push_both(tool_result("b", "r2"))
    assert contents(channels.context) == [
        "",
        "r",
        "<SubAgent@x>first</SubAgent@x>",
        "",
        "r2",
        "<SubAgent@x>second</SubAgent@x>",
    ]


def test_held_messages_go_first_when_an_unfinished_group_is_abandoned():
    # An interrupted run leaves a call unanswered; the next main-agent message ends the
    # group, and what was held enters context before it, in arrival order.
    channels = LiveChannels()
    channels.push_both(assistant(tool_calls=calls("a", "b")))
    channels.push_labelled(sub_agent("one"))
    channels.push_both(tool_result("a", "ra"))
    channels.push_both(user("hello again"))
    channels.push_labelled(sub_agent("two"))
    assert contents(channels.context) == [
        "",
        "ra",
        "<SubAgent@x>one</SubAgent@x>",
        "hello again",
        "<SubAgent@x>two</SubAgent@x>",
    ]
    assert channels.held == []


def test_clear_empties_everything():
    channels = LiveChannels()
    channels.push_both(assistant(tool_calls=calls("a")))
    channels.push_labelled(sub_agent("x"))
    channels.clear()
    assert channels.context == channels.display == channels.held == []


def test_push_display_only_leaves_context_alone():
    channels = LiveChannels()
    marker = ChatMessage(role=Role.SYSTEM, content="context compacted")
    channels.push_display_only(marker)
    assert channels.display == [marker]
    assert channels.context == []


# --- properties ------------------------------------------------------------------------


def wrapped_labelled(script: LiveChatScript) -> list[tuple[str, str]]:
    return [
        (p.message.sender_name, wrap_for_context(p.message.sender_name, clean))
        for p in script.pushes
        if p.labelled
        for clean in [strip_agent_xml_tag(p.message.sender_name, p.message.content)]
    ]


@settings(max_examples=200, deadline=None)
@given(live_chats())
def test_context_has_nothing_between_a_tool_call_and_its_last_result(script: LiveChatScript):
    context = run_live_chat(script).channels.context
    for group in script.groups:
        if not group.results:
            continue
        start = next(i for i, m in enumerate(context) if m is group.request)
        end = max(i for i, m in enumerate(context) if any(m is r for r in group.results))
        between = context[start + 1 : end + 1]
        assert all(any(m is r for r in group.results) for m in between), between


@settings(max_examples=200, deadline=None)
@given(live_chats())
def test_display_of_labelled_messages_never_shows_the_wrapper(script: LiveChatScript):
    display = run_live_chat(script).channels.display
    labelled = [m for m in display if m.sender_name]
    assert len(labelled) == sum(p.labelled for p in script.pushes)
    for message in labelled:
        assert f"<{message.sender_name}>" not in message.content
        assert f"</{message.sender_name}>" not in message.content


@settings(max_examples=200, deadline=None)
@given(live_chats())
def test_labelled_messages_reach_context_once_and_in_order(script: LiveChatScript):
    channels = run_live_chat(script).channels
    arrived = [
        (m.sender_name, m.content) for m in channels.context + channels.held if m.sender_name
    ]
    assert arrived == wrapped_labelled(script)
    if channels.held:
        assert channels.tool_group_open


@settings(max_examples=200, deadline=None)
@given(live_chats())
def test_main_agent_messages_are_in_both_channels_in_order(script: LiveChatScript):
    channels = run_live_chat(script).channels
    main = [p.message for p in script.pushes if not p.labelled]
    assert [m for m in channels.context if not m.sender_name] == main
    assert [m for m in channels.display if not m.sender_name] == main
