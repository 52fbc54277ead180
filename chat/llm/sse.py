"""Reading an OpenAI-style streamed reply: bytes → SSE events → chunk dicts → our chunks.

Three small stages, each pure and fed incrementally, so splitting the byte stream at
any point (inside a CRLF, inside a UTF-8 code point, inside a JSON line) changes nothing:

* :class:`SSEDecoder` implements the server-sent-events line protocol (WHATWG HTML §9.2):
  comments, LF / CRLF / CR line endings, multi-line ``data:``, ``event:`` and ``id:``.
* :class:`ChunkDecoder` turns events into ``chat.completion.chunk`` dicts: ``[DONE]`` ends
  the stream, JSON errors and in-stream error objects raise :class:`ProviderError`.
* :class:`StreamAccumulator` turns chunk dicts into :class:`TextDelta`,
  :class:`ReasoningDelta` and :class:`ToolCallStarted`, and builds the final
  :class:`StreamEnd`.

End of stream without ``[DONE]``: accepted when the stream produced anything (text,
reasoning, a tool call, a finish reason or usage), because several servers omit the
sentinel; ``StreamEnd.finish_reason`` is then whatever was sent (``None`` when nothing
confirmed the end). A stream that ends having produced nothing is MALFORMED_STREAM.
A connection that breaks mid-body is not an end of stream: the HTTP layer reports it.
"""

from __future__ import annotations

import codecs
import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from chat.core.messages import ToolCall
from chat.llm.retry import error_from_payload, short_detail
from chat.llm.types import (
    ErrorCategory,
    ProviderError,
    ReasoningDelta,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)

DONE_SENTINEL = "[DONE]"

ContentChunk = TextDelta | ReasoningDelta | ToolCallStarted


# --- stage 1: bytes → SSE events --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """Incremental SSE decoder: feed raw bytes, get the events completed so far."""

    def __init__(self) -> None:
        # "replace": one bad byte should cost one character, not the whole reply.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # text of the current line seen so far (no line ending)
        self._cr_pending = False  # the last text ended in "\r": a "\n" may follow in the next read
        self._started = False  # a leading BOM is stripped once
        self._data: list[str] = []
        self._event_type = ""
        self._last_id: str | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        return self._feed_text(self._utf8.decode(data), final=False)

    def close(self) -> list[SSEEvent]:
        """Flush: the last line and a last event need no trailing blank line here."""
        events = self._feed_text(self._utf8.decode(b"", final=True), final=True)
        if self._partial:
            self._take_line("".join(self._partial), events)
            self._partial = []
        self._dispatch(events)
        return events

    def _feed_text(self, text: str, *, final: bool) -> list[SSEEvent]:
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._cr_pending:
            text = "\r" + text
            self._cr_pending = False
        if not final and text.endswith("\r"):
            text = text[:-1]
            self._cr_pending = True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:
            if text:
                self._partial.append(text)
            return []
        lines = text.split("\n")
        if self._partial:
            lines[0] = "".join(self._partial) + lines[0]
            self._partial = []
        tail = lines.pop()
        if tail:
            self._partial.append(tail)
        events: list[SSEEvent] = []
        for line in lines:
            self._take_line(line, events)
        return events

    def _take_line(self, line: str, events: list[SSEEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if line[0] == ":":
            return  # comment, e.g. a keep-alive or ": OPENROUTER PROCESSING"
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        # "retry" and unknown fields are ignored: reconnection is the provider's job.

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            events.append(
                SSEEvent(
                    data="\n".join(self._data),
                    event=self._event_type or "message",
                    id=self._last_id,
                )
            )
        self._data = []
        self._event_type = ""


# --- stage 2: SSE events → chunk dicts ---------------------------------------------------


class ChunkDecoder:
    """SSE events → OpenAI chunk dicts. Everything after ``[DONE]`` is ignored."""

    def __init__(self) -> None:
        self.done = False

    def decode(self, events: Iterable[SSEEvent]) -> list[dict[str, Any]]:
        chunks: list[dict[str, Any]] = []
        for event in events:
            if self.done:
                break
            chunk = self._decode_one(event)
            if chunk is not None:
                chunks.append(chunk)
        return chunks

    def _decode_one(self, event: SSEEvent) -> dict[str, Any] | None:
        data = event.data.strip()
        if data == DONE_SENTINEL:
            self.done = True
            return None
        if event.event == "error":
            raise error_from_payload(_json_or_text(data))
        if not data:
            return None  # an empty "data:" keep-alive
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ProviderError(
                ErrorCategory.MALFORMED_STREAM,
                "The model provider sent a line that is not valid JSON: "
                + repr(short_detail(data)[:60]),
            ) from None
        if not isinstance(chunk, dict):
            raise ProviderError(
                ErrorCategory.MALFORMED_STREAM,
                "The model provider sent a stream event that is not a JSON object.",
            )
        if "error" in chunk or chunk.get("object") == "error":
            raise error_from_payload(chunk)
        return chunk


def _json_or_text(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data


def events_to_chunks(events: Iterable[SSEEvent]) -> Iterator[dict[str, Any]]:
    """Convenience generator over a complete event sequence; stops at ``[DONE]``."""
    decoder = ChunkDecoder()
    for event in events:
        yield from decoder.decode([event])
        if decoder.done:
            return


# --- stage 3: chunk dicts → our chunks --------------------------------------------------


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(8)


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    announced: bool = False


class StreamAccumulator:
    """Folds chunk dicts into deltas as they come, and the final :class:`StreamEnd`.

    Tool-call fragments are keyed by their ``index``: the first non-empty id wins, name
    and argument fragments are concatenated, and :class:`ToolCallStarted` is emitted once,
    when the call's name is first known (the name may still grow in later fragments, and
    the id may still be empty: ``index`` is the stable key).
    """

    def __init__(self, new_id: Callable[[], str] = new_tool_call_id) -> None:
        self._new_id = new_id
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._last_index = 0
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.produced_content = False  # a delta or tool call was emitted

    @property
    def produced_anything(self) -> bool:
        return self.produced_content or self.finish_reason is not None or self.usage is not None

    def add(self, chunk: dict[str, Any]) -> list[ContentChunk]:
        out: list[ContentChunk] = []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage_from(usage) or self.usage
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and (choice.get("index") or 0) == 0:
                self._add_choice(choice, out)
        if out:
            self.produced_content = True
        return out

    def _add_choice(self, choice: dict[str, Any], out: list[ContentChunk]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._text.append(content)
                out.append(TextDelta(content))
            # DeepSeek/vLLM say reasoning_content, OpenRouter/Ollama say reasoning; some send
            # both with the same text, so one of them is taken, never both.
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._reasoning.append(reasoning)
                out.append(ReasoningDelta(reasoning))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for fragment in calls:
                    if isinstance(fragment, dict):
                        self._add_tool_fragment(fragment, out)
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self.finish_reason = finish

    def _add_tool_fragment(self, fragment: dict[str, Any], out: list[ContentChunk]) -> None:
        index = self._index_of(fragment)
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _PartialCall()
        self._last_index = index
        call_id = fragment.get("id")
        if isinstance(call_id, str) and call_id and not call.id:
            call.id = call_id
        function = fragment.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if isinstance(name, str) and name:
                call.name += name
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                call.arguments.append(arguments)
        if call.name and not call.announced:
            call.announced = True
            out.append(ToolCallStarted(index=index, id=call.id, name=call.name))

    def _index_of(self, fragment: dict[str, Any]) -> int:
        index = fragment.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return index
        # Some servers omit "index": a new id opens a new call, anything else continues.
        call_id = fragment.get("id")
        if isinstance(call_id, str) and call_id:
            for known_index, call in self._calls.items():
                if call.id == call_id:
                    return known_index
            return max(self._calls, default=-1) + 1
        return self._last_index

    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            arguments = "".join(call.arguments)
            if not call.name and not arguments:
                continue  # an id-only fragment with nothing to run
            calls.append(
                ToolCall(id=call.id or self._new_id(), name=call.name, arguments=arguments)
            )
        return calls

    def finish(self, *, saw_done: bool = True) -> StreamEnd:
        """The final chunk. Without ``[DONE]``, an empty stream is MALFORMED_STREAM."""
        if not saw_done and not self.produced_anything:
            raise ProviderError(
                ErrorCategory.MALFORMED_STREAM,
                "The model provider ended the reply without sending anything.",
            )
        return StreamEnd(
            finish_reason=self.finish_reason,
            tool_calls=self.tool_calls(),
            usage=self.usage,
            text="".join(self._text),
            reasoning="".join(self._reasoning),
        )


def _usage_from(data: dict[str, Any]) -> Usage | None:
    prompt = data.get("prompt_tokens")
    completion = data.get("completion_tokens")
    if prompt is None and completion is None:
        return None
    return Usage(input_tokens=_as_int(prompt), output_tokens=_as_int(completion))


def _as_int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def accumulate(
    chunks: Iterable[dict[str, Any]], **kwargs: Any
) -> tuple[list[ContentChunk], StreamEnd]:
    """Run a whole chunk sequence through a :class:`StreamAccumulator` (for tests and tools)."""
    accumulator = StreamAccumulator(**kwargs)
    deltas: list[ContentChunk] = []
    for chunk in chunks:
        deltas.extend(accumulator.add(chunk))
    return deltas, accumulator.finish()
