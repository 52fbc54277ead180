"""Chat exports: the display history as Markdown or JSON (reasoning optional)."""

from __future__ import annotations

import re
from typing import Any

from django.utils.text import slugify

from chat.core.messages import ChatMessage, DisplayType
from chat.models import ChatSession
from chat.store import StoredEvent

EXPORTED_EVENTS = {"compacted", "complete", "cancelled", "error", "scene"}


def filename(chat: ChatSession, fmt: str, *, with_reasoning: bool = False) -> str:
    """``<title>.md``, ``<title>.json``, ``<title>-with-thinking.json``: one name per format."""
    stem = slugify(chat.display_title)[:60] or "chat"
    if with_reasoning:
        stem += "-with-thinking"
    return f"{stem}.{'json' if fmt == 'json' else 'md'}"


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^( {0,3})(#{1,6})(?=\s|$)")


def _demoted(text: str) -> str:
    """A message's own headings moved two levels down (outside code), so in the export
    only the title is a level-1 heading and only speakers are level-2 headings."""
    lines = []
    fence: str | None = None
    for line in text.splitlines():
        if match := _FENCE.match(line):
            marker = match[1]
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
        elif fence is None:
            line = _HEADING.sub(lambda m: m[1] + "#" * min(len(m[2]) + 2, 6), line)
        lines.append(line)
    return "\n".join(lines)


def _speaker(name: str) -> list[str]:
    return [f"## {name}", ""]


def _entries(events: list[StoredEvent], with_reasoning: bool) -> list[dict[str, Any]]:
    entries = []
    for event in events:
        if event.kind == "msg":
            message = ChatMessage.from_dict(event.payload)
            entry: dict[str, Any] = {
                "seq": event.seq,
                "type": message.display_type.value,
                "role": message.role,
                "content": message.content,
            }
            if message.sender_name:
                entry["sender"] = message.sender_name
            if message.tool_calls:
                entry["tool_calls"] = [c.to_dict() for c in message.tool_calls]
            if message.tool_call_id:
                entry["tool_call_id"] = message.tool_call_id
            if with_reasoning and message.reasoning_content:
                entry["reasoning"] = message.reasoning_content
            if ts := event.payload.get("timestamp_ms"):
                entry["timestamp_ms"] = ts
            entries.append(entry)
        elif event.kind in EXPORTED_EVENTS:
            payload = {k: v for k, v in event.payload.items() if k not in ("chat_id", "type")}
            entries.append({"seq": event.seq, "type": event.kind, **payload})
    return entries


def as_json(chat: ChatSession, events: list[StoredEvent], *, with_reasoning: bool) -> dict:
    return {
        "id": str(chat.pk),
        "title": chat.display_title,
        "model": chat.model,
        "created_at": chat.created_at.isoformat(),
        "messages": _entries(events, with_reasoning),
    }


def as_markdown(chat: ChatSession, events: list[StoredEvent], *, with_reasoning: bool) -> str:
    lines = [f"# {chat.display_title}", "", f"Model: {chat.model or 'default'}", ""]
    for entry in _entries(events, with_reasoning):
        kind = entry["type"]
        if kind == DisplayType.USER:
            lines += [*_speaker(entry.get("sender", "You")), _demoted(entry["content"]), ""]
        elif kind in (DisplayType.ASSISTANT_TEXT, DisplayType.TOOL_CALL_REQUEST):
            lines += _speaker(entry.get("sender", "Assistant"))
            if entry.get("reasoning"):
                quoted = "\n".join(f"> {line}" for line in entry["reasoning"].splitlines())
                lines += ["> **Thinking**", ">", quoted, ""]
            if entry["content"]:
                lines += [_demoted(entry["content"]), ""]
            for call in entry.get("tool_calls", []):
                lines += [
                    f"**Tool call** `{call['name']}`",
                    "",
                    "```json",
                    call["arguments"],
                    "```",
                    "",
                ]
        elif kind == DisplayType.TOOL_RESULT:
            lines += ["**Tool result**", "", "```", entry["content"], "```", ""]
        elif kind == DisplayType.SYSTEM:
            lines += [f"_{entry['content']}_", ""]
        elif kind == "compacted":
            lines += ["---", "", "_Context compacted. Summary:_", "", entry.get("summary", ""), ""]
        elif kind == "error":
            lines += [f"_Error ({entry.get('category')}): {entry.get('message')}_", ""]
        elif kind == "cancelled":
            lines += ["_Stopped._", ""]
        elif kind == "scene":
            lines += ["---", "", f"_Scene {entry.get('number')}: {entry.get('title')}_", ""]
    return "\n".join(lines).rstrip() + "\n"
