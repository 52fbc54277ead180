"""Turn display events into what the page shows: one partial per display type.

The full page and the live push both go through :func:`render_item`, so a
message looks the same whether it was loaded or streamed in.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.template.loader import render_to_string
from django.utils.functional import cached_property

from chat.core import eventlog
from chat.core.messages import ChatMessage, DisplayType
from chat.rendering import render_markdown
from chat.store import StoredEvent

SENDER_PALETTE = 8
MAIN_AGENT_LABEL = "Assistant"


def sender_colour(name: str) -> int:
    """A stable palette index (0–7) for a sender label."""
    return zlib.crc32(name.encode("utf-8")) % SENDER_PALETTE


def pretty_arguments(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return raw


@dataclass
class DisplayItem:
    seq: int
    kind: str
    payload: dict[str, Any]
    message: ChatMessage | None = None
    # Filled by build_items for tool-call cards: call id -> result message.
    results: dict[str, ChatMessage] = field(default_factory=dict)

    @property
    def template(self) -> str:
        return f"chat/messages/{self.kind}.html"

    @property
    def dom_id(self) -> str:
        return f"ev-{self.seq}"

    @property
    def sender(self) -> str:
        return (self.message.sender_name if self.message else None) or MAIN_AGENT_LABEL

    @property
    def colour(self) -> int | None:
        if self.message and self.message.sender_name:
            return sender_colour(self.message.sender_name)
        return None

    @cached_property
    def html(self) -> str:
        return render_markdown(self.message.content) if self.message else ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        calls = []
        for call in (self.message.tool_calls if self.message else None) or []:
            result = self.results.get(call.id)
            calls.append(
                {
                    "id": call.id,
                    "name": call.name,
                    "arguments": pretty_arguments(call.arguments),
                    "raw_arguments": call.arguments,
                    "result": result.content if result else None,
                    "status": "done" if result else "waiting",
                }
            )
        return calls


def item_from_event(event: StoredEvent) -> DisplayItem:
    if event.kind == eventlog.MSG:
        message = ChatMessage.from_dict(event.payload)
        return DisplayItem(event.seq, message.display_type.value, event.payload, message)
    return DisplayItem(event.seq, event.kind, event.payload)


def build_items(events: Iterable[StoredEvent]) -> list[DisplayItem]:
    items = [item_from_event(e) for e in events]
    results = {
        item.message.tool_call_id: item.message
        for item in items
        if item.kind == DisplayType.TOOL_RESULT and item.message and item.message.tool_call_id
    }
    for item in items:
        if item.kind == DisplayType.TOOL_CALL_REQUEST:
            item.results = results
    return items


def render_item(item: DisplayItem, **context: Any) -> str:
    return render_to_string(item.template, {"item": item, **context})
