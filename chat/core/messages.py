"""The one message type used by every channel, the agent loop and the transports.

Pure Python: no Django import here or anywhere under ``chat.core``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class DisplayType(StrEnum):
    USER = "user"
    ASSISTANT_TEXT = "assistant_text"
    TOOL_CALL_REQUEST = "tool_call_request"
    TOOL_RESULT = "tool_result"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON string as the model produced it

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(
            id=str(data.get("id") or ""),
            name=str(data.get("name") or ""),
            arguments=str(data.get("arguments") or ""),
        )


@dataclass(frozen=True, slots=True)
class Image:
    base64: str
    media_type: str


@dataclass(slots=True)
class ChatMessage:
    role: str
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    images: list[Image] | None = None  # never persisted
    reasoning_content: str | None = None
    sender_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # display-only metadata, e.g. run id

    @property
    def display_type(self) -> DisplayType:
        if self.role == Role.USER:
            return DisplayType.USER
        if self.role == Role.ASSISTANT:
            # An empty list still marks a tool-call request, as in the reference.
            if self.tool_calls is not None:
                return DisplayType.TOOL_CALL_REQUEST
            return DisplayType.ASSISTANT_TEXT
        if self.role == Role.TOOL:
            return DisplayType.TOOL_RESULT
        return DisplayType.SYSTEM

    @property
    def is_tool_request(self) -> bool:
        return self.role == Role.ASSISTANT and self.tool_calls is not None

    def copy(self, **changes: Any) -> ChatMessage:
        """A copy with its own lists and ``extra`` dict, so editing one side (say, a display
        message's metadata) never leaks into the other channel or into the log."""
        fresh: dict[str, Any] = {
            "tool_calls": None if self.tool_calls is None else list(self.tool_calls),
            "images": None if self.images is None else list(self.images),
            "extra": dict(self.extra),
        }
        fresh.update(changes)
        return replace(self, **fresh)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict. ``images`` are never written; empty optionals are omitted."""
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls is not None:
            data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.reasoning_content:
            data["reasoning_content"] = self.reasoning_content
        if self.sender_name:
            data["sender_name"] = self.sender_name
        if self.extra:
            data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatMessage:
        calls = data.get("tool_calls")
        return cls(
            role=str(data.get("role") or Role.USER),
            content=str(data.get("content") or ""),
            tool_calls=None if calls is None else [ToolCall.from_dict(c) for c in calls],
            tool_call_id=data.get("tool_call_id"),
            reasoning_content=data.get("reasoning_content") or None,
            sender_name=data.get("sender_name") or None,
            extra=dict(data.get("extra") or {}),
        )


def user(text: str, **kw: Any) -> ChatMessage:
    return ChatMessage(role=Role.USER, content=text, **kw)


def assistant(text: str = "", **kw: Any) -> ChatMessage:
    return ChatMessage(role=Role.ASSISTANT, content=text, **kw)


def system(text: str, **kw: Any) -> ChatMessage:
    return ChatMessage(role=Role.SYSTEM, content=text, **kw)


def tool_result(call_id: str, text: str, **kw: Any) -> ChatMessage:
    return ChatMessage(role=Role.TOOL, content=text, tool_call_id=call_id, **kw)
