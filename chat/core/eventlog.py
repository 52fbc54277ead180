"""Rules of the append-only event log (the "session" channel).

Events are plain dicts, as stored in the database payload:

* ``{"type": "msg", **message fields, "timestamp_ms": n}`` appends a message,
* ``{"type": "clear"}`` empties the list,
* ``{"type": "restore", "messages": [...]}`` replaces everything before it.

Context is written to the log only up to a *safe cut*: never an assistant
tool-call message without all its results. Loading replays the log and repairs
orphan calls and results, reporting whether it had to.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from chat.core.channels import LiveChannels, strip_agent_xml_tag
from chat.core.messages import ChatMessage, Role

MSG, CLEAR, RESTORE = "msg", "clear", "restore"


def msg_event(message: ChatMessage, timestamp_ms: int = 0) -> dict[str, Any]:
    event: dict[str, Any] = {"type": MSG, **message.to_dict()}
    if timestamp_ms:
        event["timestamp_ms"] = timestamp_ms
    return event


def clear_event() -> dict[str, Any]:
    return {"type": CLEAR}


def restore_event(messages: Iterable[ChatMessage]) -> dict[str, Any]:
    return {"type": RESTORE, "messages": [m.to_dict() for m in messages]}


def safe_cut(messages: list[ChatMessage], start: int = 0) -> int:
    """Index up to which ``messages[start:]`` may be persisted without splitting a tool group.

    Count-based, as in the reference: each call opens one pending result, each
    tool message closes one. Stray results (pending below zero) are clamped so a
    legacy orphan cannot block persistence for ever.
    """
    pending = 0
    last_safe = start
    for index in range(start, len(messages)):
        message = messages[index]
        if message.role == Role.ASSISTANT and message.tool_calls is not None:
            pending += len(message.tool_calls)
            if pending == 0:
                last_safe = index + 1
        elif message.role == Role.TOOL:
            pending -= 1
            if pending <= 0:
                pending = 0
                last_safe = index + 1
        elif pending == 0:
            last_safe = index + 1
    return last_safe


def replay(events: Iterable[dict[str, Any]]) -> list[ChatMessage]:
    """Rebuild a message list from events; unknown event types are ignored."""
    messages: list[ChatMessage] = []
    for event in events:
        kind = event.get("type")
        if kind == MSG:
            messages.append(ChatMessage.from_dict(event))
        elif kind == CLEAR:
            messages = []
        elif kind == RESTORE:
            messages = [ChatMessage.from_dict(m) for m in event.get("messages") or []]
    return messages


def _answered_and_requested(messages: list[ChatMessage]) -> tuple[set[str], set[str]]:
    answered = {m.tool_call_id for m in messages if m.role == Role.TOOL and m.tool_call_id}
    requested = {
        call.id
        for m in messages
        if m.role == Role.ASSISTANT and m.tool_calls
        for call in m.tool_calls
        if call.id
    }
    return answered, requested


def sanitize(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Drop orphan results and unanswered calls by id (before every provider request).

    An assistant message that loses all its calls keeps its text (and is kept even
    when empty), unlike :func:`repair_orphans`.
    """
    answered, requested = _answered_and_requested(messages)
    cleaned: list[ChatMessage] = []
    for message in messages:
        if message.role == Role.TOOL:
            if message.tool_call_id and message.tool_call_id in requested:
                cleaned.append(message)
            continue
        if message.role == Role.ASSISTANT and message.tool_calls:
            kept = [c for c in message.tool_calls if c.id and c.id in answered]
            if len(kept) != len(message.tool_calls):
                message = message.copy(tool_calls=kept or None)
        cleaned.append(message)
    return cleaned


def repair_orphans(messages: list[ChatMessage]) -> tuple[list[ChatMessage], bool]:
    """Load-time repair: like :func:`sanitize`, but an emptied blank message is dropped."""
    answered, requested = _answered_and_requested(messages)
    cleaned: list[ChatMessage] = []
    changed = False
    for message in messages:
        if message.role == Role.TOOL:
            if message.tool_call_id and message.tool_call_id in requested:
                cleaned.append(message)
            else:
                changed = True
            continue
        if message.role == Role.ASSISTANT and message.tool_calls:
            kept = [c for c in message.tool_calls if c.id and c.id in answered]
            if len(kept) != len(message.tool_calls):
                changed = True
                if not kept and not message.content.strip() and not message.reasoning_content:
                    continue
                message = message.copy(tool_calls=kept or None)
        cleaned.append(message)
    return cleaned, changed


@dataclass(frozen=True)
class LoadedLog:
    messages: list[ChatMessage]
    repaired: bool

    def repair_event(self) -> dict[str, Any] | None:
        """The ``restore`` event to append so the next load starts clean."""
        return restore_event(self.messages) if self.repaired else None


def load(events: Iterable[dict[str, Any]]) -> LoadedLog:
    messages, repaired = repair_orphans(replay(events))
    return LoadedLog(messages=messages, repaired=repaired)


def display_from_context(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Derive display messages from context: labelled messages lose their wrapper."""
    return [
        m.copy(content=strip_agent_xml_tag(m.sender_name, m.content)) if m.sender_name else m.copy()
        for m in messages
    ]


def rebuild_channels(
    context: list[ChatMessage], display: list[ChatMessage] | None = None
) -> LiveChannels:
    """Live channels from a loaded log; display falls back to one derived from context."""
    shown = list(display) if display else display_from_context(context)
    return LiveChannels(context=list(context), display=shown)
