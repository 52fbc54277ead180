"""Server-sent events framing: bytes → SSE events (and back), nothing OpenAI-specific.

:class:`SSEDecoder` implements the server-sent-events line protocol (WHATWG HTML §9.2):
comments, LF / CRLF / CR line endings, multi-line ``data:``, ``event:`` and ``id:``. It is
pure and fed incrementally, so splitting the byte stream at any point (inside a CRLF,
inside a UTF-8 code point, inside a line) changes nothing. :func:`encode_event` frames one
event for sending.

What the events carry (``chat.completion.chunk`` JSON, ``[DONE]``, error objects) is
``wire.py``'s business. A connection that breaks mid-body is not an end of stream: the
HTTP layer reports it.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


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


def encode_event(data: str, event: str | None = None) -> bytes:
    """One event as it goes on the wire: each line of ``data`` a ``data:`` line, then a
    blank line. ``data`` is sent as is (a JSON document has no raw line breaks anyway)."""
    head = f"event: {event}\n" if event else ""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return (head + lines + "\n").encode("utf-8")
