"""ChatMessage: display type, serialization, copies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.core.messages import (
    ChatMessage,
    DisplayType,
    Image,
    Role,
    ToolCall,
    assistant,
    system,
    tool_result,
    user,
)
from tests.core.strategies import IMAGE_MARKER, images, optional_reasoning, senders, texts

CALL = ToolCall(id="call_1", name="read_file", arguments='{"path": "a.py"}')
PICTURE = Image(base64=IMAGE_MARKER + "00", media_type="image/png")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (ChatMessage(role=Role.USER, content="hi"), DisplayType.USER),
        (ChatMessage(role=Role.USER, content="hi", tool_calls=[CALL]), DisplayType.USER),
        (ChatMessage(role=Role.ASSISTANT, content="hello"), DisplayType.ASSISTANT_TEXT),
        (ChatMessage(role=Role.ASSISTANT, tool_calls=[CALL]), DisplayType.TOOL_CALL_REQUEST),
        (ChatMessage(role=Role.ASSISTANT, tool_calls=[]), DisplayType.TOOL_CALL_REQUEST),
        (
            ChatMessage(role=Role.ASSISTANT, content="x", sender_name="Bob"),
            DisplayType.ASSISTANT_TEXT,
        ),
        (ChatMessage(role=Role.TOOL, content="ok", tool_call_id="call_1"), DisplayType.TOOL_RESULT),
        (ChatMessage(role=Role.TOOL, content="ok"), DisplayType.TOOL_RESULT),
        (ChatMessage(role=Role.SYSTEM, content="be nice"), DisplayType.SYSTEM),
        (ChatMessage(role=Role.SYSTEM, content="x", tool_calls=[CALL]), DisplayType.SYSTEM),
        # A role read back as a plain string from JSON behaves like the enum.
        (ChatMessage(role="assistant", tool_calls=[CALL]), DisplayType.TOOL_CALL_REQUEST),
        (ChatMessage(role="tool", tool_call_id="x"), DisplayType.TOOL_RESULT),
    ],
)
def test_display_type_for_every_role_and_tool_calls(message: ChatMessage, expected: DisplayType):
    assert message.display_type == expected


def test_is_tool_request_only_for_assistant_with_tool_calls_present():
    assert assistant(tool_calls=[]).is_tool_request
    assert assistant(tool_calls=[CALL]).is_tool_request
    assert not assistant("text").is_tool_request
    assert not user("x", tool_calls=[CALL]).is_tool_request


def test_constructors_set_role_and_fields():
    assert user("a") == ChatMessage(role=Role.USER, content="a")
    assert assistant() == ChatMessage(role=Role.ASSISTANT, content="")
    assert system("s").role == Role.SYSTEM
    result = tool_result("call_1", "out")
    assert (result.role, result.tool_call_id, result.content) == (Role.TOOL, "call_1", "out")


def test_to_dict_of_plain_message_has_only_role_and_content():
    assert user("hi").to_dict() == {"role": "user", "content": "hi"}


def test_to_dict_omits_empty_optionals():
    message = ChatMessage(
        role=Role.ASSISTANT, content="", reasoning_content="", sender_name="", extra={}
    )
    assert message.to_dict() == {"role": "assistant", "content": ""}


def test_to_dict_writes_every_present_field():
    message = ChatMessage(
        role=Role.ASSISTANT,
        content="c",
        tool_calls=[CALL],
        reasoning_content="think",
        sender_name="SubAgent@x",
        extra={"run": "r1"},
    )
    assert message.to_dict() == {
        "role": "assistant",
        "content": "c",
        "tool_calls": [{"id": "call_1", "name": "read_file", "arguments": '{"path": "a.py"}'}],
        "reasoning_content": "think",
        "sender_name": "SubAgent@x",
        "extra": {"run": "r1"},
    }


def test_empty_tool_calls_list_is_written_and_survives_round_trip():
    message = assistant(tool_calls=[])
    assert message.to_dict()["tool_calls"] == []
    back = ChatMessage.from_dict(message.to_dict())
    assert back.tool_calls == []
    assert back.display_type == DisplayType.TOOL_CALL_REQUEST


def test_tool_result_round_trip_keeps_call_id():
    message = tool_result("call_1", "out")
    assert message.to_dict() == {"role": "tool", "content": "out", "tool_call_id": "call_1"}
    assert ChatMessage.from_dict(message.to_dict()) == message


def test_images_are_never_written_and_absent_after_round_trip():
    message = user("look", images=[PICTURE])
    data = message.to_dict()
    assert "images" not in data
    assert IMAGE_MARKER not in json.dumps(data)
    back = ChatMessage.from_dict(json.loads(json.dumps(data)))
    assert back.images is None
    assert back == message.copy(images=None)


def test_from_dict_defaults_for_missing_or_null_fields():
    message = ChatMessage.from_dict({"content": None, "reasoning_content": "", "sender_name": ""})
    assert message == ChatMessage(role=Role.USER, content="")
    assert message.reasoning_content is None
    assert message.sender_name is None


def test_from_dict_ignores_event_fields():
    event = {"type": "msg", "role": "user", "content": "x", "timestamp_ms": 12}
    assert ChatMessage.from_dict(event) == user("x")


def test_tool_call_from_dict_coerces_missing_fields_to_strings():
    assert ToolCall.from_dict({"id": None}) == ToolCall(id="", name="", arguments="")


def test_copy_is_independent_of_the_original():
    original = ChatMessage(
        role=Role.ASSISTANT,
        content="c",
        tool_calls=[CALL],
        images=[PICTURE],
        extra={"run": "r1"},
    )
    duplicate = original.copy()
    assert duplicate == original
    duplicate.content = "changed"
    duplicate.extra["seq"] = 7
    duplicate.tool_calls.append(ToolCall(id="call_2", name="x", arguments="{}"))
    duplicate.images.clear()
    assert original.content == "c"
    assert original.extra == {"run": "r1"}
    assert original.tool_calls == [CALL]
    assert original.images == [PICTURE]


def test_copy_applies_changes():
    assert user("a").copy(content="b", sender_name="Bob") == user("b", sender_name="Bob")


@st.composite
def messages(draw: st.DrawFn) -> ChatMessage:
    role = draw(st.sampled_from(list(Role)))
    calls = None
    if role == Role.ASSISTANT:
        calls = draw(
            st.one_of(
                st.none(),
                st.lists(st.builds(ToolCall, id=texts, name=texts, arguments=texts), max_size=3),
            )
        )
    return ChatMessage(
        role=role,
        content=draw(texts),
        tool_calls=calls,
        tool_call_id=draw(st.one_of(st.none(), texts)) if role == Role.TOOL else None,
        images=draw(st.one_of(st.none(), images)),
        reasoning_content=draw(optional_reasoning),
        sender_name=draw(st.one_of(st.none(), senders)),
        extra=draw(st.dictionaries(st.sampled_from(["run", "seq"]), st.integers(0, 9))),
    )


@settings(max_examples=200, deadline=None)
@given(messages())
def test_json_round_trip_equals_message_without_images(message: ChatMessage):
    text = json.dumps(message.to_dict())
    assert "images" not in json.loads(text)
    assert IMAGE_MARKER not in text
    back = ChatMessage.from_dict(json.loads(text))
    assert back == message.copy(images=None)
    assert back.display_type == message.display_type
    assert back.to_dict() == message.to_dict()
