"""In-memory doubles for testing the agent loop as plain Python.

* :class:`ScriptedProvider` plays a list of scripted responses, one per ``stream()`` or
  ``complete()`` call (in call order), and records every request it received.
* :class:`MemoryHost` implements :class:`chat.agent.loop.RunHost` in memory, persisting
  context at the safe cut as the real store does, so tests can check what would be saved.

A scripted response is a list of steps, or a single exception to raise at once. A step is
a stream chunk (yielded), an exception (raised there, after the earlier chunks), or a
zero-argument callable (called; awaited if it returns an awaitable) — for example to
queue a user message while the reply streams, or to pause on an event.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from chat.agent import events as ev
from chat.agent.loop import QueuedText
from chat.core.channels import LiveChannels
from chat.core.eventlog import safe_cut
from chat.core.messages import ChatMessage, Role, ToolCall
from chat.llm.types import (
    ChatRequest,
    ReasoningDelta,
    StreamChunk,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)

Step = StreamChunk | BaseException | Callable[[], Any]
Response = Sequence[Step] | BaseException

DEFAULT_USAGE = Usage(input_tokens=11, output_tokens=7)
_call_ids = itertools.count(1)


# --- building scripted responses ------------------------------------------------------------


def call(name: str, arguments: dict[str, Any] | str | None = None, call_id: str = "") -> ToolCall:
    """A tool call; ``arguments`` as a dict is JSON-encoded, a string is sent as is."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=call_id or f"call_{next(_call_ids)}", name=name, arguments=raw)


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] if text else []


def text_reply(
    text: str,
    *,
    reasoning: str = "",
    usage: Usage | None = DEFAULT_USAGE,
    finish_reason: str = "stop",
    chunk_size: int = 4,
) -> list[Step]:
    """Reasoning deltas, then text deltas, then the ``StreamEnd``."""
    steps: list[Step] = [ReasoningDelta(p) for p in pieces(reasoning, chunk_size)]
    steps += [TextDelta(p) for p in pieces(text, chunk_size)]
    steps.append(end(text, reasoning=reasoning, usage=usage, finish_reason=finish_reason))
    return steps


def tool_reply(
    *calls: ToolCall, text: str = "", reasoning: str = "", usage: Usage | None = DEFAULT_USAGE
) -> list[Step]:
    """Optional text, a ``ToolCallStarted`` per call, then the ``StreamEnd`` with the calls."""
    steps: list[Step] = [ReasoningDelta(reasoning)] if reasoning else []
    steps += [TextDelta(text)] if text else []
    steps += [ToolCallStarted(i, c.id, c.name) for i, c in enumerate(calls)]
    steps.append(
        end(text, reasoning=reasoning, usage=usage, finish_reason="tool_calls", calls=calls)
    )
    return steps


def end(
    text: str = "",
    *,
    reasoning: str = "",
    usage: Usage | None = DEFAULT_USAGE,
    finish_reason: str | None = "stop",
    calls: Iterable[ToolCall] = (),
) -> StreamEnd:
    return StreamEnd(
        finish_reason=finish_reason,
        tool_calls=list(calls),
        usage=usage,
        text=text,
        reasoning=reasoning,
    )


# --- the provider -----------------------------------------------------------------------------


class ScriptExhausted(AssertionError):
    """The loop made a request the script did not foresee."""


class ScriptedProvider:
    """A :class:`chat.llm.types.Provider` that plays scripted responses in call order."""

    name = "scripted"

    def __init__(self, responses: Iterable[Response] = ()) -> None:
        self.responses: list[Response] = list(responses)
        # (kind, request) per call, kind "stream" or "complete"; messages are copied so later
        # changes to the loop's list do not rewrite history.
        self.calls: list[tuple[str, ChatRequest]] = []

    async def aclose(self) -> None:
        """Nothing to close (the Provider protocol's lifecycle)."""

    def add(self, *responses: Response) -> None:
        self.responses.extend(responses)

    @property
    def requests(self) -> list[ChatRequest]:
        return [request for _kind, request in self.calls]

    @property
    def stream_requests(self) -> list[ChatRequest]:
        return [request for kind, request in self.calls if kind == "stream"]

    @property
    def complete_requests(self) -> list[ChatRequest]:
        return [request for kind, request in self.calls if kind == "complete"]

    @property
    def remaining(self) -> int:
        return len(self.responses)

    def _next(self, kind: str, request: ChatRequest) -> Response:
        self.calls.append(
            (
                kind,
                dataclasses.replace(
                    request,
                    messages=[m.copy() for m in request.messages],
                    tools=list(request.tools),
                ),
            )
        )
        if not self.responses:
            raise ScriptExhausted(
                f"no scripted response left for {kind} request #{len(self.calls)}"
            )
        return self.responses.pop(0)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        response = self._next("stream", request)
        async for chunk in _play(response):
            yield chunk

    async def complete(self, request: ChatRequest) -> StreamEnd:
        response = self._next("complete", request)
        async for chunk in _play(response):
            if isinstance(chunk, StreamEnd):
                return chunk
        raise AssertionError("a scripted complete() response needs a StreamEnd")

    async def list_models(self) -> list[str]:
        return ["scripted-model"]


async def _play(response: Response) -> AsyncIterator[StreamChunk]:
    if isinstance(response, BaseException):
        raise response
    for step in response:
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            outcome = step()
            if inspect.isawaitable(outcome):
                await outcome
            continue
        yield step


# --- the host ---------------------------------------------------------------------------------


@dataclass
class Commit:
    """Snapshot of the channels (copies) and the persisted context at one ``commit()``."""

    context: list[ChatMessage]
    display: list[ChatMessage]
    persisted: list[ChatMessage]


@dataclass
class Suspension:
    message: ChatMessage
    pending: list[ToolCall]
    usage: Usage


class MemoryHost:
    """A :class:`chat.agent.loop.RunHost` that keeps everything in lists.

    ``persisted`` is what the session log would replay to: context written only up to the
    safe cut (as ``chat.store.persist_context`` does), replaced on ``restore_context``.
    ``display_persisted`` counts display messages written so far.
    """

    def __init__(
        self,
        context: Iterable[ChatMessage] = (),
        display: Iterable[ChatMessage] | None = None,
        *,
        prompt: str = "You are a helpful assistant.",
        granted: Iterable[str] = (),
    ) -> None:
        context = [m.copy() for m in context]
        shown = [m.copy() for m in (context if display is None else display)]
        self.channels = LiveChannels(context=context, display=shown)
        self.prompt = prompt
        self.grants: set[str] = set(granted)
        self.persisted: list[ChatMessage] = [m.copy() for m in context]
        self.persisted_count = len(context)
        self.display_persisted = len(shown)
        self.events: list[ev.RunEvent] = []
        self.commits: list[Commit] = []
        self.stream_updates: list[tuple[str, str]] = []
        self.queue: list[QueuedText] = []
        self.suspensions: list[Suspension] = []
        self.restores: list[list[ChatMessage]] = []
        self.system_prompt_calls = 0
        self.on_commit: list[Callable[[MemoryHost], None]] = []  # checks run at every commit
        self._seq = itertools.count(len(shown) + 1)

    # --- what tests drive ---------------------------------------------------------------------

    def send(self, text: str) -> int:
        """A user message as the app receives it: shown in display now, queued for the run."""
        seq = next(self._seq)
        self.channels.push_display_only(ChatMessage(role=Role.USER, content=text))
        self.display_persisted = len(self.channels.display)
        self.queue.append(QueuedText(text, seq))
        return seq

    def resumed(self) -> MemoryHost:
        """A fresh host as a new process would build it: context replayed from ``persisted``."""
        fresh = MemoryHost(
            self.persisted, self.channels.display, prompt=self.prompt, granted=self.grants
        )
        fresh.queue = list(self.queue)
        fresh.on_commit = list(self.on_commit)
        fresh._seq = self._seq
        return fresh

    def events_of(self, kind: type[ev.RunEvent]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def event_types(self) -> list[str]:
        return [e.type for e in self.events]

    # --- RunHost ------------------------------------------------------------------------------

    async def emit(self, event: ev.RunEvent) -> None:
        self.events.append(event)

    async def commit(self) -> None:
        context = self.channels.context
        cut = safe_cut(context, self.persisted_count)
        self.persisted.extend(m.copy() for m in context[self.persisted_count : cut])
        self.persisted_count = cut
        self.display_persisted = len(self.channels.display)
        self.commits.append(
            Commit(
                context=[m.copy() for m in context],
                display=[m.copy() for m in self.channels.display],
                persisted=[m.copy() for m in self.persisted],
            )
        )
        for check in self.on_commit:
            check(self)

    async def stream_update(self, text: str, reasoning: str) -> None:
        self.stream_updates.append((text, reasoning))

    async def take_queued(self) -> list[QueuedText]:
        taken, self.queue = self.queue, []
        return taken

    async def system_prompt(self) -> str:
        self.system_prompt_calls += 1
        return self.prompt

    async def restore_context(self, messages: list[ChatMessage]) -> None:
        self.restores.append([m.copy() for m in messages])
        self.persisted = [m.copy() for m in messages]
        self.persisted_count = len(messages)

    async def suspend(self, message: ChatMessage, pending: list[ToolCall], usage: Usage) -> None:
        self.suspensions.append(Suspension(message.copy(), list(pending), usage))

    def granted(self, tool_name: str) -> bool:
        return tool_name in self.grants
