"""The OpenAI Chat Completions wire format, both directions. Pure: no httpx, no Django.

As a client of an OpenAI-compatible server (what ``openai.OpenAIProvider`` does):

* :func:`build_payload` / :func:`to_openai_messages`: our :class:`ChatRequest` and
  :class:`ChatMessage` list → the request's JSON payload;
* :class:`ChunkDecoder`: SSE events (``sse.SSEDecoder``) → ``chat.completion.chunk`` dicts:
  ``[DONE]`` ends the stream, JSON errors and in-stream error objects raise
  :class:`ProviderError`;
* :class:`StreamAccumulator`: one chunk dict at a time → :class:`TextDelta`,
  :class:`ReasoningDelta` and :class:`ToolCallStarted`, and the final :class:`StreamEnd`;
  :func:`completion_to_chunk` turns a non-streamed ``chat.completion`` into one chunk.

As a server speaking the same format (a relay in front of our providers):

* :func:`request_from_payload` / :func:`messages_from_openai`: a request's JSON payload →
  our :class:`ChatRequest` / :class:`ChatMessage` list (:class:`WireError` when it cannot
  be read);
* :class:`ChunkEncoder`: our stream chunks → ``chat.completion.chunk`` dicts, ending with
  the finish chunk and a usage-only chunk;
* :func:`completion_from_reply`: a whole reply (:class:`StreamEnd`) → a ``chat.completion``.

Round trips (``tests/llm/test_wire.py``): messages → payload → messages keeps every field
the wire carries (role, content, tool calls, tool call id, reasoning, images), and chunks →
wire chunks → decoded chunks keeps the text, reasoning and tool calls however the text
was split.

End of stream without ``[DONE]``: accepted when the stream produced anything (text,
reasoning, a tool call, a finish reason or usage), because several servers omit the
sentinel; ``StreamEnd.finish_reason`` is then whatever was sent (``None`` when nothing
confirmed the end). A stream that ends having produced nothing is MALFORMED_STREAM.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from chat.core.eventlog import sanitize
from chat.core.messages import ChatMessage, Image, Role, ToolCall
from chat.llm.retry import error_from_payload, short_detail
from chat.llm.sse import SSEEvent
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    ProviderError,
    ReasoningDelta,
    StreamChunk,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)

DONE_SENTINEL = "[DONE]"

ContentChunk = TextDelta | ReasoningDelta | ToolCallStarted


class WireError(ValueError):
    """A request payload that cannot be read as chat completions (a relay answers 400)."""


# --- our request → the request payload ---------------------------------------------------


def to_openai_messages(system_prompt: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Our messages → OpenAI chat messages, after dropping orphan tool calls/results."""
    wire: list[dict[str, Any]] = []
    if system_prompt.strip():
        wire.append({"role": "system", "content": system_prompt})
    for message in sanitize(messages):
        converted = _to_openai_message(message)
        if converted is not None:
            wire.append(converted)
    return wire


def _to_openai_message(message: ChatMessage) -> dict[str, Any] | None:
    if message.role == Role.USER:
        return {"role": "user", "content": _user_content(message)}
    if message.role == Role.ASSISTANT:
        return _assistant_message(message)
    if message.role == Role.TOOL:
        if not message.tool_call_id:
            return None
        return {"role": "tool", "content": message.content, "tool_call_id": message.tool_call_id}
    return {"role": "system", "content": message.content}


def _user_content(message: ChatMessage) -> str | list[dict[str, Any]]:
    if not message.images:
        return message.content
    parts: list[dict[str, Any]] = []
    if message.content:
        parts.append({"type": "text", "text": message.content})
    for image in message.images:
        url = f"data:{image.media_type};base64,{image.base64}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _assistant_message(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": "assistant"}
    if message.content:
        wire["content"] = message.content
    if message.tool_calls:
        wire["tool_calls"] = [_tool_call_dict(call) for call in message.tool_calls]
    elif "content" not in wire:
        wire["content"] = ""  # OpenAI requires content when there are no tool calls
    if message.reasoning_content:
        # DeepSeek-style thinking APIs want the reasoning back within a tool-call turn.
        wire["reasoning_content"] = message.reasoning_content
    return wire


def _tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        # Some servers reject "" as arguments; "{}" means the same: no arguments.
        "function": {"name": call.name, "arguments": call.arguments or "{}"},
    }


def build_payload(request: ChatRequest, *, stream: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": request.model,
        "messages": to_openai_messages(request.system_prompt, request.messages),
        "stream": stream,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if request.tools:
        payload["tools"] = request.tools
    if request.max_tokens is not None:
        payload["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        payload["temperature"] = request.temperature
    return payload


# --- a request payload → our request (relay side) ----------------------------------------

_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+);base64,(.*)", re.DOTALL)


def request_from_payload(payload: Any) -> ChatRequest:
    """A chat-completions request payload → our :class:`ChatRequest`.

    A leading system message becomes ``system_prompt`` (later ones stay messages);
    ``max_tokens`` (or ``max_completion_tokens``), ``temperature`` and ``tools`` are kept.
    Raises :class:`WireError` when the payload is not a readable request.
    """
    if not isinstance(payload, dict):
        raise WireError("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise WireError("'model' must be a non-empty string")
    messages = messages_from_openai(payload.get("messages"))
    system_prompt = ""
    if messages and messages[0].role == Role.SYSTEM:
        system_prompt = messages.pop(0).content
    tools = payload.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise WireError("'tools' must be a list of objects")
    max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        raise WireError("'max_tokens' must be an integer")
    temperature = payload.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or isinstance(temperature, bool)
    ):
        raise WireError("'temperature' must be a number")
    return ChatRequest(
        model=model,
        messages=messages,
        system_prompt=system_prompt,
        tools=list(tools),
        max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
    )


def messages_from_openai(messages: Any) -> list[ChatMessage]:
    """OpenAI chat messages → ours. Content may be a string, null or a list of parts:
    text parts are joined with newlines, ``data:`` image URLs become :class:`Image`."""
    if not isinstance(messages, list):
        raise WireError("'messages' must be a list")
    return [_from_openai_message(message, position) for position, message in enumerate(messages)]


def _from_openai_message(message: Any, position: int) -> ChatMessage:
    where = f"messages[{position}]"
    if not isinstance(message, dict):
        raise WireError(f"{where} must be an object")
    role = message.get("role")
    if role == "developer":  # OpenAI's newer name for the system role
        role = Role.SYSTEM
    if role not in (Role.USER, Role.ASSISTANT, Role.TOOL, Role.SYSTEM):
        raise WireError(f"{where}: unknown role {role!r}")
    content, images = _content_from(message.get("content"), where)
    out = ChatMessage(role=Role(role), content=content, images=images or None)
    if role == Role.ASSISTANT:
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise WireError(f"{where}.tool_calls must be a list")
            out.tool_calls = [_call_from(call, f"{where}.tool_calls") for call in calls] or None
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out.reasoning_content = reasoning
    elif role == Role.TOOL:
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise WireError(f"{where}: a tool message needs a 'tool_call_id'")
        out.tool_call_id = call_id
    return out


def _content_from(content: Any, where: str) -> tuple[str, list[Image]]:
    if content is None or isinstance(content, str):
        return content or "", []
    if not isinstance(content, list):
        raise WireError(f"{where}.content must be a string or a list of parts")
    texts: list[str] = []
    images: list[Image] = []
    for part in content:
        if not isinstance(part, dict):
            raise WireError(f"{where}.content parts must be objects")
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            match = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
            if match is None:
                raise WireError(f"{where}: only data: URLs are accepted for images")
            images.append(Image(base64=match.group(2), media_type=match.group(1)))
        else:
            raise WireError(f"{where}: unsupported content part {kind!r}")
    return "\n".join(texts), images


def _call_from(call: Any, where: str) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise WireError(f"{where}: each call needs a function with a name")
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some clients send the object itself
        arguments = json.dumps(arguments)
    return ToolCall(
        id=str(call.get("id") or new_tool_call_id()),
        name=function["name"],
        arguments=arguments if isinstance(arguments, str) else "",
    )


# --- SSE events → chunk dicts ------------------------------------------------------------


class ChunkDecoder:
    """SSE events → OpenAI chunk dicts. Everything after ``[DONE]`` is ignored."""

    def __init__(self) -> None:
        self.done = False

    def decode(self, events: Iterable[SSEEvent]) -> list[dict[str, Any]]:
        return list(self.decode_each(events))

    def decode_each(self, events: Iterable[SSEEvent]) -> Iterator[dict[str, Any]]:
        """The events' chunks, lazily: the chunks before a failing event are yielded before
        it raises. One network read may carry a few tokens and then an error; the tokens
        were sent, and the caller must see them (and know the reply had started)."""
        for event in events:
            if self.done:
                return
            chunk = self._decode_one(event)
            if chunk is not None:
                yield chunk

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


# --- chunk dicts → our chunks ------------------------------------------------------------


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


def merge_deltas(chunks: list[ContentChunk]) -> list[ContentChunk]:
    """Adjacent text deltas as one, and adjacent reasoning deltas as one, in order.

    A paced read brings a few tokens at once (three at 30 tokens/s and a read every
    0.1 s); handed on one by one, each took the provider's generators, the loop's
    bookkeeping and the host's update to itself, though the page is pushed once a read.
    """
    if len(chunks) < 2:
        return chunks
    out: list[ContentChunk] = []
    texts: list[str] = []
    kind: type | None = None
    for chunk in chunks:
        if type(chunk) is not kind or kind is ToolCallStarted:
            if texts:
                out.append(kind("".join(texts)))  # type: ignore[misc]
                texts = []
            kind = type(chunk)
        if kind is ToolCallStarted:
            out.append(chunk)
        else:
            texts.append(chunk.text)  # type: ignore[union-attr]
    if texts:
        out.append(kind("".join(texts)))  # type: ignore[misc]
    return out


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


def completion_to_chunk(data: Any) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` as one equivalent streamed chunk."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError(
            ErrorCategory.MALFORMED_STREAM, "The model provider's reply had no choices."
        )
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    delta = dict(message)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        # A complete message has no "index"; position is the index.
        delta["tool_calls"] = [
            {**call, "index": position}
            for position, call in enumerate(calls)
            if isinstance(call, dict)
        ]
    return {
        "choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}],
        "usage": data.get("usage"),
    }


# --- our chunks → chunk dicts (relay side) -----------------------------------------------


def new_completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def usage_dict(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def default_finish_reason(reply: StreamEnd) -> str:
    """The reply's finish reason, or the one OpenAI would give when upstream sent none."""
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


class ChunkEncoder:
    """Our stream chunks → ``chat.completion.chunk`` dicts, as OpenAI streams them.

    The first dict carries ``role``; text and reasoning go out as they come
    (``content`` / ``reasoning_content``); a tool call goes out by ``index`` (0, 1, … in
    the order calls started, then any call never announced): its id and name when
    :class:`ToolCallStarted` arrives, its arguments with :class:`StreamEnd` (our chunks
    carry them only there). :class:`StreamEnd` also sends whatever of its text and
    reasoning the deltas did not (all of it for a reply from ``complete()``), then the
    finish-reason chunk and, with ``include_usage``, a usage-only chunk (``choices``
    empty; ``usage`` null when the reply had none). :class:`Retrying` is not on the wire.
    The caller sends ``data: [DONE]`` after the last dict.
    """

    def __init__(
        self,
        model: str,
        *,
        completion_id: str | None = None,
        created: int | None = None,
        include_usage: bool = True,
    ) -> None:
        self.model = model
        self.id = completion_id or new_completion_id()
        self.created = int(time.time()) if created is None else created
        self.include_usage = include_usage
        self._started = False
        self._announced: list[ToolCallStarted] = []  # by wire index
        self._sent = {"content": 0, "reasoning_content": 0}  # characters sent so far

    def encode(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            out.append(self._chunk({"role": "assistant", "content": ""}))
        if isinstance(chunk, TextDelta):
            out += self._text("content", chunk.text)
        elif isinstance(chunk, ReasoningDelta):
            out += self._text("reasoning_content", chunk.text)
        elif isinstance(chunk, ToolCallStarted):
            fragment: dict[str, Any] = {"index": len(self._announced), "type": "function"}
            if chunk.id:
                fragment["id"] = chunk.id
            fragment["function"] = {"name": chunk.name, "arguments": ""}
            self._announced.append(chunk)
            out.append(self._chunk({"tool_calls": [fragment]}))
        elif isinstance(chunk, StreamEnd):
            out += self._end(chunk)
        return out

    def encode_all(self, chunks: Iterable[StreamChunk]) -> list[dict[str, Any]]:
        return [item for chunk in chunks for item in self.encode(chunk)]

    def _text(self, key: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        self._sent[key] += len(text)
        return [self._chunk({key: text})]

    def _end(self, end: StreamEnd) -> list[dict[str, Any]]:
        # Text the deltas did not carry (a reply from complete(), say) goes out first.
        out = self._text("reasoning_content", end.reasoning[self._sent["reasoning_content"] :])
        out += self._text("content", end.text[self._sent["content"] :])
        fragments = [
            fragment
            for call, wire_index, announced in self._match_calls(end.tool_calls)
            if (fragment := _rest_of_call(call, wire_index, announced))
        ]
        if fragments:
            out.append(self._chunk({"tool_calls": fragments}))
        out.append(self._chunk({}, finish_reason=default_finish_reason(end)))
        if self.include_usage:
            usage = usage_dict(end.usage) if end.usage is not None else None
            out.append(self._envelope([], usage=usage))
        return out

    def _match_calls(
        self, calls: list[ToolCall]
    ) -> Iterator[tuple[ToolCall, int, ToolCallStarted | None]]:
        """Each final call with its wire index and its announcement (None if never sent).

        Final calls come in upstream index order, and every announced call is among them
        (it had a name) with a name that starts with the announced one.
        """
        pending = sorted(range(len(self._announced)), key=lambda i: self._announced[i].index)
        next_index = len(self._announced)
        for call in calls:
            if pending:
                announced = self._announced[pending[0]]
                if call.name.startswith(announced.name) and announced.id in ("", call.id):
                    yield call, pending.pop(0), announced
                    continue
            yield call, next_index, None
            next_index += 1

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return self._envelope([{"index": 0, "delta": delta, "finish_reason": finish_reason}])

    def _envelope(
        self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None
    ) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if not choices:
            chunk["usage"] = usage
        return chunk


def _rest_of_call(
    call: ToolCall, wire_index: int, announced: ToolCallStarted | None
) -> dict[str, Any] | None:
    """What the client has not seen of ``call`` (None: nothing)."""
    fragment: dict[str, Any] = {"index": wire_index}
    function: dict[str, str] = {}
    if announced is None:
        fragment["id"] = call.id
        fragment["type"] = "function"
        function["name"] = call.name
    else:
        if not announced.id:
            fragment["id"] = call.id
        if call.name != announced.name:
            function["name"] = call.name[len(announced.name) :]
    if call.arguments:
        function["arguments"] = call.arguments
    if function:
        fragment["function"] = function
    return fragment if len(fragment) > 1 else None


def completion_from_reply(
    reply: StreamEnd,
    model: str,
    *,
    completion_id: str | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """A whole reply → a non-streamed ``chat.completion`` dict.

    ``content`` is null when the reply is only tool calls, as OpenAI sends it.
    """
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if not reply.text and not reply.tool_calls:
        message["content"] = ""
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.tool_calls
        ]
    data: dict[str, Any] = {
        "id": completion_id or new_completion_id(),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": default_finish_reason(reply)}
        ],
    }
    if reply.usage is not None:
        data["usage"] = usage_dict(reply.usage)
    return data
