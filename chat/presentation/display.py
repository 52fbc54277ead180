"""What people see: display events folded into items, rendered by one partial each.

The full page and the live push both render through the partials named here,
so a message looks the same whether it was loaded or streamed in. Events that
only change state (a tool started, an approval was answered, a queued message
was taken) are folded into the items they belong to on the page, and pushed
as small out-of-band updates of those same partials when live.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.template.loader import render_to_string
from django.utils.functional import cached_property
from django.utils.translation import get_language, gettext, gettext_noop

from chat.core import eventlog
from chat.core.branches import Versions
from chat.core.messages import ChatMessage
from chat.presentation.markdown import (
    HtmlCache,
    forget_rendered_markdown,
    highlight_file,
    render_markdown,
)
from chat.store import StoredEvent

SENDER_PALETTE = 8
ITEM_CACHE_SIZE = 2048
MAIN_AGENT_LABEL = gettext_noop("Assistant")
# Event kinds shown as items of their own (besides messages).
ITEM_KINDS = {
    "compacted",
    "complete",
    "cancelled",
    "error",
    "model_switched",
    "scene",
    "artifact",
}
# Items that can carry a switcher of versions (the first shown after a branch point), by
# their event kind and by their item kind.
VERSION_EVENTS = ("msg", "error", "cancelled")
VERSION_ITEMS = {"user", "assistant_text", "tool_call_request", "error", "cancelled"}
CALL_EVENT_KINDS = ("tool_start", "tool_end", "approval_required", "approval_decided")
# Tools whose approval shows the file written rather than the raw arguments.
FILE_WRITING_TOOLS = {"write_file"}
STATUS_LABELS = {
    "waiting": gettext_noop("waiting"),
    "approval": gettext_noop("waiting for approval"),
    "approved": gettext_noop("approved"),
    "running": gettext_noop("running"),
    "done": gettext_noop("done"),
    "failed": gettext_noop("failed"),
    "denied": gettext_noop("denied"),
}


def sender_colour(name: str) -> int:
    """A stable palette index (0–7) for a sender label."""
    return zlib.crc32(name.encode("utf-8")) % SENDER_PALETTE


def pretty_arguments(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return raw


def call_dom_id(call_id: str) -> str:
    """A DOM id part for a tool call id: readable, and one-to-one.

    Letters, digits and ``-`` stay; every other character (``_`` included) becomes
    ``_<hex code point>_``. ``_`` never stands for itself, so two different call ids
    can never give the same id (slugifying made ``call_1`` and ``call-1`` one element).
    """
    out = [
        ch if (ch.isascii() and ch.isalnum()) or ch == "-" else f"_{ord(ch):x}_" for ch in call_id
    ]
    return "".join(out) or "_"


@dataclass
class CallState:
    """Where one tool call stands, folded from its events."""

    id: str
    name: str
    arguments: str
    status: str = "waiting"
    approval: dict[str, Any] | None = None  # the pending approval_required payload
    decision: dict[str, Any] | None = None  # the approval_decided payload

    @property
    def dom_id(self) -> str:
        return call_dom_id(self.id)

    @property
    def status_label(self) -> str:
        return gettext(STATUS_LABELS[self.status]) if self.status in STATUS_LABELS else self.status

    @property
    def pretty_arguments(self) -> str:
        return pretty_arguments(self.arguments)

    @property
    def file_preview(self) -> dict[str, str] | None:
        """A pending file write, as the person deciding reads it: its name and its content
        highlighted (not a JSON string with escaped newlines)."""
        data = (self.approval or {}).get("input")
        if self.name not in FILE_WRITING_TOOLS or not isinstance(data, dict):
            return None
        path, content = data.get("path"), data.get("content")
        if not isinstance(path, str) or not isinstance(content, str):
            return None
        return {"path": path, "html": highlight_file(path, content)}

    def apply(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "approval_required":
            self.status, self.approval = "approval", payload
        elif kind == "approval_decided":
            self.decision, self.approval = payload, None
            self.status = "approved" if payload.get("decision") == "approved" else "denied"
        elif kind == "tool_start":
            self.status = "running"
        elif kind == "tool_end":
            self.status = payload.get("status") or "done"


@dataclass
class DisplayItem:
    seq: int
    kind: str
    payload: dict[str, Any]
    message: ChatMessage | None = None
    calls: list[CallState] = field(default_factory=list)
    queued: bool = False
    versions: Versions | None = None  # its switcher, when the item is one of several versions

    @property
    def template(self) -> str:
        return f"chat/messages/{self.kind}.html"

    @property
    def dom_id(self) -> str:
        return f"ev-{self.seq}"

    @property
    def extra(self) -> dict[str, Any]:
        return self.message.extra if self.message else {}

    @property
    def sender(self) -> str:
        return (self.message.sender_name if self.message else None) or gettext(MAIN_AGENT_LABEL)

    @property
    def colour(self) -> int | None:
        if self.message and self.message.sender_name:
            return sender_colour(self.message.sender_name)
        return None

    @property
    def state_key(self) -> str:
        """What may change about the item after it was written (its HTML depends on it).

        An approval request and a decision, once there, never change for a call.
        """
        calls = ";".join(
            f"{c.status},{c.approval is not None:d},{c.decision is not None:d}" for c in self.calls
        )
        shown = self.versions
        versions = f"{shown.base},{shown.index},{shown.count}" if shown else ""
        return f"{self.queued:d}|{calls}|{versions}"

    @property
    def is_reply(self) -> bool:
        """A reply a run streamed (the main agent's or a voice's): it can be regenerated."""
        message = self.message
        if message is None or message.role != "assistant" or not message.extra.get("run_id"):
            return False
        return not message.sender_name or "voice" in message.extra

    @cached_property
    def html(self) -> str:
        return render_markdown(self.message.content) if self.message else ""


def item_from_event(event: StoredEvent) -> DisplayItem | None:
    if event.kind == eventlog.MSG:
        message = ChatMessage.from_dict(event.payload)
        item = DisplayItem(event.seq, message.display_type.value, event.payload, message)
        if message.tool_calls:
            item.calls = [CallState(c.id, c.name, c.arguments) for c in message.tool_calls]
        item.queued = bool(message.extra.get("queued"))
        return item
    if event.kind in ITEM_KINDS:
        return DisplayItem(event.seq, event.kind, event.payload)
    return None


def build_items(
    events: Iterable[StoredEvent], later_call_events: Iterable[StoredEvent] = ()
) -> list[DisplayItem]:
    """Items for a page of events; ``later_call_events`` completes calls whose
    status events fall after the page (older pages of a long chat)."""
    events = list(events)
    items: list[DisplayItem] = []
    calls: dict[str, CallState] = {}
    queued: dict[int, DisplayItem] = {}
    for event in events:
        item = item_from_event(event)
        if item is not None:
            items.append(item)
            calls.update({c.id: c for c in item.calls})
            if item.queued:
                queued[item.seq] = item
    seen = {e.seq for e in events}
    for event in [*events, *(e for e in later_call_events if e.seq not in seen)]:
        if event.kind in CALL_EVENT_KINDS:
            call = calls.get(event.payload.get("call_id", ""))
            if call:
                call.apply(event.kind, event.payload)
        elif event.kind == "input_taken":
            taken = queued.get(event.payload.get("input_seq"))
            if taken:
                taken.queued = False
    return items


def call_ids(items: Iterable[DisplayItem]) -> list[str]:
    return [c.id for item in items for c in item.calls]


# An item's HTML is fixed by its event (stored events never change) and by the state of
# its tool calls and queued flag: rendering the partials was most of a long chat's page.
_rendered_items = HtmlCache(ITEM_CACHE_SIZE)


def render_item(item: DisplayItem, *, chat_id=None) -> str:
    """The item through its partial; cached when the chat is known (a seq is per chat)."""
    if chat_id is None:
        return render_to_string(item.template, {"item": item})
    key = f"{chat_id}:{item.seq}:{item.state_key}:{get_language()}"
    html = _rendered_items.get(key)
    if html is None:
        html = render_to_string(item.template, {"item": item})
        _rendered_items.put(key, html)
    return html


def forget_rendered() -> None:
    """Empty the caches of rendered items and markdown (benchmarks, tests)."""
    _rendered_items.clear()
    forget_rendered_markdown()


def render_items(chat_id, items: Iterable[DisplayItem]) -> str:
    return "".join(render_item(item, chat_id=chat_id) for item in items)
