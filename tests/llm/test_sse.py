"""The SSE decoder (sse.py), and the chunk decoder and accumulator (wire.py) fed by it."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.core.messages import ToolCall
from chat.llm.sse import SSEDecoder, SSEEvent
from chat.llm.types import (
    ErrorCategory,
    ProviderError,
    ReasoningDelta,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)
from chat.llm.wire import ChunkDecoder, StreamAccumulator, accumulate, events_to_chunks


def decode_all(*parts: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for part in parts:
        events += decoder.feed(part)
    return events + decoder.close()


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c for c in cuts if 0 <= c <= len(data))})
    return [data[a:b] for a, b in itertools.pairwise(points)]


# --- SSEDecoder: examples -------------------------------------------------------------


def test_one_event_per_blank_line():
    events = decode_all(b"data: one\n\ndata: two\n\n")
    assert [e.data for e in events] == ["one", "two"]
    assert all(e.event == "message" and e.id is None for e in events)


def test_events_are_returned_as_soon_as_their_blank_line_arrives():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: one\n") == []
    assert decoder.feed(b"\n") == [SSEEvent("one")]
    assert decoder.close() == []


def test_comment_and_keepalive_lines_are_ignored():
    events = decode_all(b": keep-alive\n\n: OPENROUTER PROCESSING\ndata: x\n\n:\n\n")
    assert events == [SSEEvent("x")]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_is_understood(ending: bytes):
    raw = ending.join([b"event: add", b"data: a", b"data: b", b"", b"data: c", b"", b""])
    assert decode_all(raw) == [SSEEvent("a\nb", event="add"), SSEEvent("c")]


def test_crlf_split_across_two_feeds_is_one_line_ending():
    # If "\r" and "\n" counted as two endings, the blank line would dispatch "a" alone.
    assert decode_all(b"data: a\r", b"\ndata: b\r\n\r\n") == [SSEEvent("a\nb")]


def test_cr_at_the_end_of_a_feed_followed_by_other_text_is_a_line_ending():
    assert decode_all(b"data: a\r", b"data: b\r\r") == [SSEEvent("a\nb")]


def test_multi_line_data_is_joined_with_newlines():
    assert decode_all(b'data: {\ndata:   "k": 1\ndata: }\n\n') == [SSEEvent('{\n  "k": 1\n}')]


def test_only_one_space_after_the_colon_is_dropped():
    events = decode_all(b"data:x\n\ndata:  two spaces\n\ndata\n\ndata:\n\n")
    assert [e.data for e in events] == ["x", " two spaces", "", ""]


def test_event_and_id_fields():
    events = decode_all(b"id: 7\nevent: error\ndata: boom\n\ndata: next\n\nid\ndata: z\n\n")
    assert events == [
        SSEEvent("boom", event="error", id="7"),
        SSEEvent("next", event="message", id="7"),  # the last event id persists
        SSEEvent("z", id=""),
    ]


def test_id_with_nul_is_ignored_and_unknown_fields_too():
    assert decode_all(b"id: a\x00b\nretry: 10\nfoo: bar\ndata: x\n\n") == [SSEEvent("x")]


def test_blank_lines_without_data_dispatch_nothing():
    assert decode_all(b"\n\n\nevent: ping\n\n\r\n") == []


def test_utf8_code_point_split_across_reads():
    raw = "data: é🎉漢\n\n".encode()
    for cut in range(len(raw) + 1):
        assert decode_all(raw[:cut], raw[cut:]) == [SSEEvent("é🎉漢")]


def test_invalid_utf8_becomes_a_replacement_character_not_an_error():
    assert decode_all(b"data: a\xffb\n\n") == [SSEEvent("a\ufffdb")]


def test_leading_byte_order_mark_is_stripped_once():
    assert decode_all(b"\xef\xbb", b"\xbfdata: x\n\n") == [SSEEvent("x")]


def test_final_event_without_blank_line_is_flushed_at_close():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: last") == [SSEEvent("a")]
    assert decoder.close() == [SSEEvent("last")]


def test_close_treats_a_pending_cr_as_a_line_ending():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: last\r") == []
    assert decoder.close() == [SSEEvent("last")]


# --- SSEDecoder: split invariance (hypothesis) ------------------------------------------

field_value = st.text(
    alphabet=st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)),
    max_size=12,
)
line_item = st.one_of(
    st.tuples(st.just("data"), field_value),
    st.tuples(st.just("event"), field_value),
    st.tuples(st.just("id"), field_value),
    st.tuples(st.just("comment"), field_value),
    st.tuples(st.just("blank"), st.just("")),
)


def render_line(kind: str, value: str) -> str:
    if kind == "blank":
        return ""
    if kind == "comment":
        return ":" + value
    return f"{kind}: {value}"


def expected_events(items: list[tuple[str, str]]) -> list[SSEEvent]:
    """The SSE rules applied to structured lines (the reference the decoder must match)."""
    events, data, event_type, last_id = [], [], "", None
    for kind, value in [*items, ("blank", "")]:
        if kind == "blank":
            if data:
                events.append(SSEEvent("\n".join(data), event_type or "message", last_id))
            data, event_type = [], ""
        elif kind == "data":
            data.append(value)
        elif kind == "event":
            event_type = value
        elif kind == "id":
            last_id = value
    return events


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(line_item, max_size=25),
    ending=st.sampled_from(["\n", "\r\n", "\r"]),
    data=st.data(),
)
def test_decoding_matches_the_rules_however_the_bytes_are_split(items, ending, data):
    raw = "".join(render_line(kind, value) + ending for kind, value in items).encode()
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
    assert decode_all(*split_at(raw, cuts)) == expected_events(items)


@settings(max_examples=300)
@given(
    lines=st.lists(st.tuples(line_item, st.sampled_from(["\n", "\r\n", "\r"])), max_size=25),
    data=st.data(),
)
def test_mixed_line_endings_decode_the_same_whole_or_split(lines, data):
    raw = "".join(render_line(*item) + ending for item, ending in lines).encode()
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=20))
    assert decode_all(*split_at(raw, cuts)) == decode_all(raw)


@settings(max_examples=100)
@given(data=st.data())
def test_every_single_byte_feed_matches_one_big_feed(data):
    text = data.draw(st.text(min_size=1, max_size=20).filter(lambda t: "\r" not in t))
    raw = ("data: " + json.dumps(text, ensure_ascii=False) + "\r\n\r\n").encode()
    one_byte_at_a_time = decode_all(*(raw[i : i + 1] for i in range(len(raw))))
    assert one_byte_at_a_time == decode_all(raw) == [SSEEvent(json.dumps(text, ensure_ascii=False))]


# --- ChunkDecoder -------------------------------------------------------------------------


def test_done_ends_the_stream_and_later_data_is_ignored():
    decoder = ChunkDecoder()
    chunks = decoder.decode(
        [SSEEvent('{"a": 1}'), SSEEvent("[DONE]"), SSEEvent('{"b": 2}'), SSEEvent("not json")]
    )
    assert chunks == [{"a": 1}]
    assert decoder.done
    assert decoder.decode([SSEEvent('{"c": 3}')]) == []


def test_events_to_chunks_stops_at_done():
    events = [SSEEvent('{"a": 1}'), SSEEvent(" [DONE] "), SSEEvent("{broken")]
    assert list(events_to_chunks(events)) == [{"a": 1}]


def test_empty_data_is_a_keepalive_not_an_error():
    assert ChunkDecoder().decode([SSEEvent(""), SSEEvent("  ")]) == []


@pytest.mark.parametrize("data", ['{"choices": [', "hello", "[1, 2]", '"text"'])
def test_malformed_json_is_a_malformed_stream_error(data: str):
    with pytest.raises(ProviderError) as caught:
        ChunkDecoder().decode([SSEEvent(data)])
    assert caught.value.category == ErrorCategory.MALFORMED_STREAM


@pytest.mark.parametrize(
    ("payload", "category"),
    [
        ({"error": {"message": "Rate limit reached", "type": "requests"}}, "rate_limited"),
        ({"error": {"message": "slow down", "code": "rate_limit_exceeded"}}, "rate_limited"),
        ({"error": {"message": "busy", "code": 429}}, "rate_limited"),
        ({"error": {"message": "x", "code": "context_length_exceeded"}}, "context_too_long"),
        (
            {"error": {"message": "This model's maximum context length is 8192 tokens"}},
            "context_too_long",
        ),
        ({"error": {"message": "server_is_overloaded"}}, "provider_error"),
        ({"error": "something broke"}, "provider_error"),
        ({"object": "error", "message": "Internal error", "code": 500}, "provider_error"),
    ],
)
def test_error_objects_inside_a_200_stream_raise_by_category(payload: dict, category: str):
    with pytest.raises(ProviderError) as caught:
        ChunkDecoder().decode([SSEEvent(json.dumps(payload))])
    assert caught.value.category == category
    assert not caught.value.streamed


def test_error_event_type_raises_with_the_upstream_message():
    with pytest.raises(ProviderError) as caught:
        ChunkDecoder().decode([SSEEvent("upstream exploded", event="error")])
    assert caught.value.category == ErrorCategory.PROVIDER_ERROR
    assert "upstream exploded" in caught.value.message


# --- StreamAccumulator ----------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, **extra}


def test_text_reasoning_finish_and_usage_only_final_chunk():
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Let me "}),
        chunk({"reasoning": "think."}),
        chunk({"content": "Hel", "reasoning_content": None}),
        chunk({"content": "lo"}),
        chunk({}, finish="stop"),
        chunk(None, usage={"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}),
    ]
    deltas, end = accumulate(chunks)
    assert deltas == [
        ReasoningDelta("Let me "),
        ReasoningDelta("think."),
        TextDelta("Hel"),
        TextDelta("lo"),
    ]
    assert end == StreamEnd(
        finish_reason="stop",
        tool_calls=[],
        usage=Usage(input_tokens=12, output_tokens=5),
        text="Hello",
        reasoning="Let me think.",
    )


def test_reasoning_sent_under_both_names_is_taken_once():
    deltas, end = accumulate([chunk({"reasoning_content": "x", "reasoning": "x"})])
    assert deltas == [ReasoningDelta("x")]
    assert end.reasoning == "x"


def test_usage_is_none_when_the_provider_sends_none():
    _, end = accumulate([chunk({"content": "a"}, usage=None), chunk({}, finish="stop")])
    assert end.usage is None


def test_tool_calls_are_assembled_by_index_in_index_order():
    chunks = [
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "se"}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "read"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "", "function": {"name": "arch"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_other", "function": {"arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a"}'}}]}),
        chunk({}, finish="tool_calls"),
    ]
    deltas, end = accumulate(chunks)
    # Announced once each, when the name is first known; the first id wins.
    assert deltas == [
        ToolCallStarted(index=1, id="call_b", name="se"),
        ToolCallStarted(index=0, id="call_a", name="read"),
    ]
    assert end.tool_calls == [
        ToolCall(id="call_a", name="read", arguments='{"path": "a"}'),
        ToolCall(id="call_b", name="search", arguments="{}"),
    ]
    assert end.finish_reason == "tool_calls"


def test_tool_call_without_id_gets_a_generated_call_id():
    _, end = accumulate(
        [chunk({"tool_calls": [{"index": 0, "function": {"name": "t", "arguments": "{}"}}]})]
    )
    assert re.fullmatch(r"call_[0-9a-f]{16}", end.tool_calls[0].id)


def test_tool_call_fragments_without_index_follow_their_id():
    chunks = [
        chunk({"tool_calls": [{"id": "a", "function": {"name": "one", "arguments": "{"}}]}),
        chunk({"tool_calls": [{"function": {"arguments": "}"}}]}),
        chunk({"tool_calls": [{"id": "b", "function": {"name": "two", "arguments": "[]"}}]}),
    ]
    _, end = accumulate(chunks)
    assert end.tool_calls == [ToolCall("a", "one", "{}"), ToolCall("b", "two", "[]")]


def test_end_without_done_is_fine_once_something_was_produced():
    accumulator = StreamAccumulator()
    accumulator.add(chunk({"content": "partial"}))
    end = accumulator.finish(saw_done=False)
    assert (end.text, end.finish_reason) == ("partial", None)


def test_end_without_done_and_without_anything_is_malformed():
    accumulator = StreamAccumulator()
    accumulator.add(chunk({"role": "assistant", "content": ""}))
    with pytest.raises(ProviderError) as caught:
        accumulator.finish(saw_done=False)
    assert caught.value.category == ErrorCategory.MALFORMED_STREAM
    assert accumulator.finish(saw_done=True).text == ""  # an empty but confirmed reply


def test_choices_other_than_the_first_are_ignored():
    other = {"index": 1, "delta": {"content": "B"}, "finish_reason": None}
    deltas, end = accumulate([{"choices": [other, {"index": 0, "delta": {"content": "A"}}]}])
    assert deltas == [TextDelta("A")]
    assert end.text == "A"


# --- accumulator and whole pipeline: fragmentation invariance (hypothesis) ----------------

piece_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=30,
)
tool_spec = st.tuples(
    st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
    piece_text,
    st.sampled_from(["", "call_given"]),
)


def fragments(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=6))))
    return [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]


@st.composite
def responses(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A reply (expected totals) and one random way of streaming it as chunks."""
    reasoning, text = draw(piece_text), draw(piece_text)
    tools = draw(st.lists(tool_spec, max_size=3))
    usage = draw(st.booleans())
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": p}) for p in fragments(draw, reasoning) if p]
    chunks += [chunk({"content": p}) for p in fragments(draw, text) if p]
    tool_fragments = []
    for index, (name, arguments, call_id) in enumerate(tools):
        names = fragments(draw, name)
        args = fragments(draw, arguments)
        for position in range(max(len(names), len(args))):
            function = {"name": names[position] if position < len(names) else ""}
            function["arguments"] = args[position] if position < len(args) else ""
            tool_fragments.append(
                {"index": index, "id": call_id if position == 0 else "", "function": function}
            )
    if draw(st.booleans()):  # interleave the calls, keeping each call's fragments in order
        schedule = draw(st.permutations([f["index"] for f in tool_fragments]))
        per_call = {i: [f for f in tool_fragments if f["index"] == i] for i in set(schedule)}
        tool_fragments = [per_call[i].pop(0) for i in schedule]
    chunks += [chunk({"tool_calls": [f]}) for f in tool_fragments]
    chunks.append(chunk({}, finish="tool_calls" if tools else "stop"))
    if usage:
        chunks.append(chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 4}))
    expected = {
        "text": text,
        "reasoning": reasoning,
        "tools": [(n, a, i) for n, a, i in tools],
        "usage": Usage(3, 4) if usage else None,
    }
    return expected, chunks


def ids_in_order() -> Any:
    counter = itertools.count()
    return lambda: f"call_gen_{next(counter)}"


def check_end(end: StreamEnd, expected: dict[str, Any]) -> None:
    assert end.text == expected["text"]
    assert end.reasoning == expected["reasoning"]
    assert end.usage == expected["usage"]
    generated = itertools.count()
    wanted = []
    for name, arguments, call_id in expected["tools"]:
        wanted.append(ToolCall(call_id or f"call_gen_{next(generated)}", name, arguments))
    assert end.tool_calls == wanted


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_accumulated_reply_does_not_depend_on_how_it_was_fragmented(response):
    expected, chunks = response
    deltas, end = accumulate(chunks, new_id=ids_in_order())
    check_end(end, expected)
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == expected["text"]
    started = [d.index for d in deltas if isinstance(d, ToolCallStarted)]
    assert sorted(started) == list(range(len(expected["tools"])))


def to_sse_bytes(chunks: list[dict[str, Any]], ending: str, comments: bool) -> bytes:
    out = []
    for item in chunks:
        if comments:
            out.append(": keep-alive" + ending)
        out.append("data: " + json.dumps(item, ensure_ascii=False) + ending + ending)
    out.append("data: [DONE]" + ending + ending + "data: {ignored" + ending)
    return "".join(out).encode()


def run_pipeline(parts: list[bytes]) -> tuple[list[Any], StreamEnd]:
    sse, decoder = SSEDecoder(), ChunkDecoder()
    accumulator = StreamAccumulator(new_id=ids_in_order())
    deltas: list[Any] = []
    for part in [*parts, b""]:
        events = sse.feed(part) if part else sse.close()
        for item in decoder.decode(events):
            deltas += accumulator.add(item)
    return deltas, accumulator.finish(saw_done=decoder.done)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    response=responses(),
    ending=st.sampled_from(["\n", "\r\n", "\r"]),
    comments=st.booleans(),
    data=st.data(),
)
def test_whole_pipeline_is_invariant_to_byte_splits(response, ending, comments, data):
    expected, chunks = response
    raw = to_sse_bytes(chunks, ending, comments)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=30))
    whole = run_pipeline([raw])
    split = run_pipeline(split_at(raw, cuts))
    assert split == whole
    check_end(split[1], expected)
