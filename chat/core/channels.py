"""Writing rules for the two live channels (context and display).

* Main-agent messages go unchanged to both (``push_both``).
* Sender-labelled messages (sub-agents, personas, a human teacher) go clean to
  display and wrapped as ``<Sender>text</Sender>`` to context, so the model knows
  who spoke while people see plain text with a label.
* A labelled message that arrives while a tool group is open in context is shown
  in display at once but held back from context until the group closes: context
  must never have anything between a tool call and its results.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from chat.core.messages import ChatMessage, Role


def wrap_for_context(sender: str, text: str) -> str:
    return f"<{sender}>{text}</{sender}>"


def strip_agent_xml_tag(sender: str, content: str) -> str:
    """Remove an exact ``<sender>…</sender>`` wrapper; anything else is returned as is."""
    opening, closing = f"<{sender}>", f"</{sender}>"
    if (
        len(content) >= len(opening) + len(closing)
        and content.startswith(opening)
        and content.endswith(closing)
    ):
        return content[len(opening) : len(content) - len(closing)]
    return content


def open_tool_call_ids(messages: list[ChatMessage]) -> set[str]:
    """Ids of tool calls in the trailing tool group that still wait for a result.

    Counted per id, not as a set: providers that send no call ids give every call the
    id "", and one result must not close a group of two such calls.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == Role.TOOL:
            continue
        if message.is_tool_request:
            waiting = Counter(c.id for c in message.tool_calls or [])
            waiting.subtract(
                m.tool_call_id for m in messages[index + 1 :] if m.tool_call_id is not None
            )
            return {call_id for call_id, missing in waiting.items() if missing > 0}
        return set()
    return set()


@dataclass
class LiveChannels:
    """The context and display lists of one chat, plus messages held back."""

    context: list[ChatMessage] = field(default_factory=list)
    display: list[ChatMessage] = field(default_factory=list)
    held: list[ChatMessage] = field(default_factory=list)

    @property
    def tool_group_open(self) -> bool:
        return bool(open_tool_call_ids(self.context))

    def push_both(self, message: ChatMessage) -> None:
        """A main-agent message: the same text in both channels."""
        self.display.append(message.copy())
        if message.role != Role.TOOL:
            # Only results follow a tool call, so any other main-agent message means the
            # group was abandoned (an interrupted run): what waited goes first, in order.
            self._flush_held()
        self.context.append(message)
        self.release_held()

    def push_labelled(self, message: ChatMessage, *, display: bool = True) -> None:
        """A sender-labelled message: clean in display, wrapped in context.

        ``display=False`` writes the context side only (a sub-agent's tool-call note,
        whose display side is a structured card).
        """
        if not message.sender_name:
            raise ValueError("push_labelled needs a message with sender_name")
        sender = message.sender_name
        clean = strip_agent_xml_tag(sender, message.content)
        if display:
            self.display.append(message.copy(content=clean))
        # Always queue behind anything already held, so arrival order is kept.
        self.held.append(message.copy(content=wrap_for_context(sender, clean), extra={}))
        self.release_held()

    def push_display_only(self, message: ChatMessage) -> None:
        self.display.append(message)

    def push_context_only(self, message: ChatMessage) -> None:
        """A message people already see (a queued user message, a resumed tool call)."""
        if message.role != Role.TOOL and not message.is_tool_request:
            self._flush_held()
        self.context.append(message)
        self.release_held()

    def replace_context(self, messages: list[ChatMessage]) -> None:
        """Compaction: a new context list; anything held still follows it."""
        self.context[:] = list(messages)
        self.release_held()

    def release_held(self) -> None:
        if self.held and not self.tool_group_open:
            self._flush_held()

    def _flush_held(self) -> None:
        self.context.extend(self.held)
        self.held = []

    def clear(self) -> None:
        self.context.clear()
        self.display.clear()
        self.held.clear()
