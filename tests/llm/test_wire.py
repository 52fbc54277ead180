"""chat.llm.wire: the OpenAI wire format both ways, with round-trip properties."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.core.eventlog import sanitize
from chat.core.messages import ChatMessage, Image, Role, ToolCall, assistant, tool_result, user
from chat.llm.sse import SSEDecoder, encode_event
from chat.llm.types import (
    ChatRequest,
    ReasoningDelta,
    Retrying,
    StreamChunk,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)
from chat.llm.wire import (
    DONE_SENTINEL,
    ChunkDecoder,
    ChunkEncoder,
    StreamAccumulator,
    WireError,
    accumulate,
    build_payload,
    completion_from_reply,
    completion_to_chunk,
    merge_deltas,
    messages_from_openai,
    request_from_payload,
    to_openai_messages,
)

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


# --- our request → payload ------------------------------------------------------------------


def test_messages_are_converted_to_the_openai_shape():
    messages = [
        user("look", images=[Image(base64="QUJD", media_type="image/png")]),
        assistant(
            "",
            tool_calls=[ToolCall("call_1", "read", ""), ToolCall("call_x", "lost", "{}")],
            reasoning_content="I should read.",
        ),
        tool_result("call_1", "file text"),
        tool_result("call_orphan", "dropped by sanitize"),
        ChatMessage(role="tool", content="no id"),
        assistant("Done."),
        assistant(""),
    ]
    assert to_openai_messages("  You are helpful.  ", messages) == [
        {"role": "system", "content": "  You are helpful.  "},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read", "arguments": "{}"},
                }
            ],
            "reasoning_content": "I should read.",
        },
        {"role": "tool", "content": "file text", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Done."},
        {"role": "assistant", "content": ""},
    ]


def test_blank_system_prompt_is_left_out_and_optional_fields_too():
    payload = build_payload(
        ChatRequest(model="m", messages=[user("x")], system_prompt=" \n"), stream=True
    )
    assert payload == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    full = build_payload(
        ChatRequest(model="m", messages=[], tools=TOOLS, max_tokens=5, temperature=0.2),
        stream=False,
    )
    assert (full["tools"], full["max_tokens"], full["temperature"]) == (TOOLS, 5, 0.2)
    assert "stream_options" not in full and full["stream"] is False


# --- payload → our request -------------------------------------------------------------------


def test_a_request_payload_becomes_our_request():
    payload = {
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]},
            {"role": "developer", "content": "later instructions"},
        ],
        "tools": TOOLS,
        "max_completion_tokens": 7,
        "temperature": 1,
        "stream": True,
    }
    request = request_from_payload(payload)
    assert request.model == "gpt-x"
    assert request.system_prompt == "Be brief."
    assert (request.tools, request.max_tokens, request.temperature) == (TOOLS, 7, 1.0)
    assert request.messages == [
        ChatMessage(role=Role.USER, content="a\nb"),
        ChatMessage(role=Role.ASSISTANT, tool_calls=[ToolCall("c1", "read", "{}")]),
        ChatMessage(role=Role.TOOL, content="ok", tool_call_id="c1"),
        ChatMessage(role=Role.SYSTEM, content="later instructions"),
    ]


def test_images_as_data_urls_and_arguments_given_as_an_object():
    [message, reply] = messages_from_openai(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}
                ],
            },
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
                "reasoning": "thought",
            },
        ]
    )
    assert message.images == [Image(base64="QUJD", media_type="image/png")]
    assert message.content == ""
    [call] = reply.tool_calls or []
    assert (call.name, json.loads(call.arguments), call.id.startswith("call_")) == (
        "f",
        {"a": 1},
        True,
    )
    assert reply.reasoning_content == "thought"


@pytest.mark.parametrize(
    ("payload", "phrase"),
    [
        ([], "JSON object"),
        ({"messages": []}, "model"),
        ({"model": "m", "messages": "hi"}, "must be a list"),
        ({"model": "m", "messages": ["hi"]}, "messages[0] must be an object"),
        ({"model": "m", "messages": [{"role": "robot", "content": ""}]}, "unknown role"),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "string or a list"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
            "unsupported content part",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
                    }
                ],
            },
            "data: URLs",
        ),
        (
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]},
            "function with a name",
        ),
        ({"model": "m", "messages": [], "max_tokens": "5"}, "max_tokens"),
        ({"model": "m", "messages": [], "temperature": True}, "temperature"),
        ({"model": "m", "messages": [], "tools": ["read"]}, "tools"),
    ],
)
def test_unreadable_payloads_raise_a_wire_error(payload: Any, phrase: str):
    with pytest.raises(WireError, match=phrase.replace("[", r"\[").replace("]", r"\]")):
        request_from_payload(payload)


# --- property: messages → payload → messages ------------------------------------------------

short_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=12,
)
call_ids = st.from_regex(r"call_[a-z0-9]{1,6}", fullmatch=True)
tool_calls = st.builds(
    ToolCall,
    id=call_ids,
    name=st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
    arguments=st.text(min_size=1, max_size=20),  # "" goes out as "{}": see the test below
)
images = st.builds(
    Image,
    base64=st.from_regex(r"[A-Za-z0-9+/]{0,12}=?", fullmatch=True),
    media_type=st.sampled_from(["image/png", "image/jpeg", "image/webp"]),
)
messages = st.one_of(
    st.builds(
        ChatMessage,
        role=st.just(Role.USER),
        content=short_text,
        images=st.none() | st.lists(images, min_size=1, max_size=2),
    ),
    st.builds(
        ChatMessage,
        role=st.just(Role.ASSISTANT),
        content=short_text,
        tool_calls=st.none() | st.lists(tool_calls, min_size=1, max_size=3),
        reasoning_content=st.none() | short_text.filter(bool),
    ),
    st.builds(ChatMessage, role=st.just(Role.TOOL), content=short_text, tool_call_id=call_ids),
    st.builds(ChatMessage, role=st.just(Role.SYSTEM), content=short_text),
)


def wire_fields(message: ChatMessage) -> tuple[Any, ...]:
    """What the wire carries of a message (not sender_name or extra)."""
    return (
        message.role,
        message.content,
        message.tool_calls,
        message.tool_call_id if message.role == Role.TOOL else None,
        message.images or None,
        message.reasoning_content if message.role == Role.ASSISTANT else None,
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, max_size=8), st.text(max_size=5), st.text(max_size=5))
def test_messages_survive_the_wire_both_ways(sent: list[ChatMessage], sender: str, key: str):
    for message in sent:
        message.sender_name = sender or None  # not on the wire: must not matter
        message.extra = {key: 1} if key else {}
    payload = build_payload(ChatRequest(model="m", messages=sent), stream=True)
    # Through JSON, as a relay would receive it.
    back = request_from_payload(json.loads(json.dumps(payload)))
    expected = sanitize(sent)  # orphan tool calls and results are dropped on the way out
    if expected and expected[0].role == Role.SYSTEM:
        assert back.system_prompt == expected.pop(0).content
    assert [wire_fields(m) for m in back.messages] == [wire_fields(m) for m in expected]


def test_empty_arguments_go_out_as_an_empty_object():
    sent = [assistant(tool_calls=[ToolCall("c", "f", "")]), tool_result("c", "r")]
    [call] = messages_from_openai(to_openai_messages("", sent))[0].tool_calls or []
    assert call.arguments == "{}"


# --- our chunks → wire chunks ----------------------------------------------------------------


def test_encoded_stream_looks_like_openai():
    encoder = ChunkEncoder("gpt-x", completion_id="chatcmpl-1", created=42)
    end = StreamEnd(
        finish_reason=None,
        tool_calls=[ToolCall("c1", "read", '{"p": 1}')],
        usage=Usage(5, 6),
        text="Hi",
        reasoning="hm",
    )
    chunks: list[StreamChunk] = [
        ReasoningDelta("hm"),
        Retrying(1, 3, 0.1, "unreachable", "x"),  # type: ignore[arg-type]
        TextDelta("Hi"),
        ToolCallStarted(index=0, id="c1", name="read"),
        end,
    ]
    out = encoder.encode_all(chunks)
    assert all(c["id"] == "chatcmpl-1" and c["model"] == "gpt-x" for c in out)
    assert all(c["object"] == "chat.completion.chunk" and c["created"] == 42 for c in out)
    deltas = [c["choices"][0]["delta"] for c in out if c["choices"]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "hm"},
        {"content": "Hi"},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "type": "function",
                    "id": "c1",
                    "function": {"name": "read", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"p": 1}'}}]},
        {},
    ]
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1]["choices"] == []
    assert out[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}


def test_usage_chunk_is_left_out_when_not_asked_for():
    encoder = ChunkEncoder("m", include_usage=False)
    out = encoder.encode(StreamEnd("stop", [], None, "", ""))
    assert [c["choices"][0]["finish_reason"] for c in out if c["choices"]] == [None, "stop"]
    assert all(c["choices"] for c in out)


def test_whole_reply_as_a_completion():
    reply = StreamEnd("stop", [], Usage(1, 2), "Hello", "")
    data = completion_from_reply(reply, "m", completion_id="chatcmpl-2", created=7)
    assert data == {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    calls = StreamEnd(None, [ToolCall("c", "f", "{}")], None, "", "why")
    message = completion_from_reply(calls, "m")["choices"][0]["message"]
    assert message["content"] is None and message["reasoning_content"] == "why"
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


@settings(max_examples=100)
@given(
    text=short_text,
    reasoning=short_text,
    calls=st.lists(tool_calls, max_size=3, unique_by=lambda c: c.id),
    usage=st.none() | st.builds(Usage, st.integers(0, 99), st.integers(0, 99)),
)
def test_a_completion_reads_back_as_the_same_reply(text, reasoning, calls, usage):
    reply = StreamEnd("stop" if not calls else "tool_calls", calls, usage, text, reasoning)
    wire = json.loads(json.dumps(completion_from_reply(reply, "m")))
    assert accumulate([completion_to_chunk(wire)])[1] == reply


# --- property: chunks → wire chunks → chunks -------------------------------------------------


def split(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=8))))
    return [piece for a, b in itertools.pairwise([0, *cuts, len(text)]) if (piece := text[a:b])]


@st.composite
def our_streams(draw: st.DrawFn) -> tuple[list[StreamChunk], StreamEnd]:
    """A reply as our provider would stream it: deltas in random pieces, then StreamEnd."""
    text, reasoning = draw(short_text), draw(short_text)
    calls = draw(st.lists(tool_calls, max_size=3, unique_by=lambda c: c.id))
    announce = draw(st.lists(st.booleans(), min_size=len(calls), max_size=len(calls)))
    chunks: list[StreamChunk] = [ReasoningDelta(p) for p in split(draw, reasoning)]
    chunks += [TextDelta(p) for p in split(draw, text)]
    for index, (call, announced) in enumerate(zip(calls, announce, strict=True)):
        if announced:  # upstream indexes need not start at 0 or be contiguous
            chunks.append(ToolCallStarted(index=index * 2 + 1, id=call.id, name=call.name))
    finish = draw(st.sampled_from([None, "stop", "length", "tool_calls"]))
    usage = draw(st.none() | st.builds(Usage, st.integers(0, 999), st.integers(0, 999)))
    end = StreamEnd(finish, list(calls), usage, text, reasoning)
    return [*chunks, end], end


def decode_wire(raw: bytes, cuts: list[int]) -> tuple[list[Any], StreamEnd]:
    points = sorted({0, len(raw), *cuts})
    sse, decoder, accumulator = SSEDecoder(), ChunkDecoder(), StreamAccumulator()
    deltas: list[Any] = []
    for a, b in itertools.pairwise(points):
        for item in decoder.decode(sse.feed(raw[a:b])):
            deltas += accumulator.add(item)
    for item in decoder.decode(sse.close()):
        deltas += accumulator.add(item)
    assert decoder.done
    return deltas, accumulator.finish()


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(stream=our_streams(), data=st.data())
def test_our_chunks_survive_the_wire_however_the_text_is_split(stream, data):
    chunks, end = stream
    encoder = ChunkEncoder("m")
    raw = b"".join(
        encode_event(json.dumps(item, ensure_ascii=False)) for item in encoder.encode_all(chunks)
    ) + encode_event(DONE_SENTINEL)
    deltas, back = decode_wire(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=20)))
    expected_finish = end.finish_reason or ("tool_calls" if end.tool_calls else "stop")
    assert (back.finish_reason, back.usage) == (expected_finish, end.usage)
    assert (back.text, back.reasoning) == (end.text, end.reasoning)
    # On the wire, calls go in the order they started, then those never announced.
    announced_ids = [c.id for c in chunks if isinstance(c, ToolCallStarted)]
    rank = {call_id: position for position, call_id in enumerate(announced_ids)}
    in_wire_order = sorted(end.tool_calls, key=lambda c: rank.get(c.id, len(rank)))
    assert back.tool_calls == in_wire_order
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == end.text
    assert "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) == end.reasoning
    started = [(d.id, d.name) for d in deltas if isinstance(d, ToolCallStarted)]
    announced = [(c.id, c.name) for c in chunks if isinstance(c, ToolCallStarted)]
    assert started[: len(announced)] == announced  # announced calls are announced again first
    assert sorted(started) == sorted((c.id, c.name) for c in end.tool_calls)


def test_a_call_announced_before_its_id_and_full_name_were_known():
    end = StreamEnd("tool_calls", [ToolCall("late_id", "read_file", '{"p": 1}')], None, "", "")
    chunks: list[StreamChunk] = [ToolCallStarted(index=3, id="", name="read"), end]
    [_, back] = accumulate(ChunkEncoder("m").encode_all(chunks))
    assert back.tool_calls == end.tool_calls


def test_a_whole_reply_relayed_as_a_stream_sends_its_text_at_the_end():
    end = StreamEnd("stop", [ToolCall("c", "f", "{}")], Usage(2, 3), "All of it", "why")
    deltas, back = accumulate(ChunkEncoder("m").encode_all([end]))
    assert back == end
    assert [type(d) for d in deltas] == [ReasoningDelta, TextDelta, ToolCallStarted]
    # and nothing is sent twice when the deltas carried part of it
    chunks: list[StreamChunk] = [TextDelta("All "), end]
    _, again = accumulate(ChunkEncoder("m").encode_all(chunks))
    assert again.text == "All of it"


# --- a read's deltas merged ----------------------------------------------------------------


def test_merge_deltas_joins_runs_of_one_kind_and_keeps_the_order():
    started = ToolCallStarted(index=0, id="c1", name="read")
    chunks = [
        ReasoningDelta("x"),
        ReasoningDelta("y"),
        TextDelta("a"),
        TextDelta(" b"),
        started,
        started,
        TextDelta(" c"),
        ReasoningDelta("z"),
    ]
    assert merge_deltas(chunks) == [
        ReasoningDelta("xy"),
        TextDelta("a b"),
        started,
        started,
        TextDelta(" c"),
        ReasoningDelta("z"),
    ]
    assert merge_deltas([]) == []
    assert merge_deltas([TextDelta("a")]) == [TextDelta("a")]


@given(st.lists(st.tuples(st.sampled_from(["text", "reasoning", "call"]), st.text(min_size=1))))
def test_merged_deltas_carry_the_same_text_and_calls(pieces):
    kinds = {"text": TextDelta, "reasoning": ReasoningDelta}
    chunks = [
        kinds[kind](text) if kind in kinds else ToolCallStarted(index=0, id="c", name=text)
        for kind, text in pieces
    ]
    merged = merge_deltas(chunks)
    for kind in (TextDelta, ReasoningDelta):
        assert "".join(c.text for c in merged if type(c) is kind) == "".join(
            c.text for c in chunks if type(c) is kind
        )
    assert [c for c in merged if type(c) is ToolCallStarted] == [
        c for c in chunks if type(c) is ToolCallStarted
    ]
    assert all(
        type(a) is not type(b) or type(a) is ToolCallStarted for a, b in itertools.pairwise(merged)
    )
