"""Several speakers in one reply: a cast, and a streaming parser of tagged segments.

A run may speak with more than one voice (classroom personas, a panel of agents):
the model is told the cast and writes each speaker's reply as a tagged segment,
``<Ada>text</Ada><Basil>text</Basil>``, in one call. :class:`VoiceSplitter` turns
that text, fed in chunks of any size, into segments that each become one labelled
message (clean text in display, ``<Name>…</Name>`` in context: the labelled write
of :mod:`chat.core.channels`).

The rules: names are matched case-insensitively against the cast and written as
the cast spells them; segments of names not in the cast are dropped; at most
``max_replies`` segments are kept; whitespace and stray text between segments are
dropped; output with no segment of a cast member (plain text, unknown names) is one
reply of the fallback speaker with the raw text. The result depends only on the
whole text, never on how it was split into chunks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_REPLIES = 3
TAG_NAME_MAX = 60  # a "<" with no ">" within this many characters opens no tag
CAST_HEADER = "Speakers in this chat"


@dataclass(frozen=True)
class Voices:
    """Who may speak in a run, and who says what cannot be parsed."""

    cast: tuple[str, ...]
    fallback: str = ""
    max_replies: int = MAX_REPLIES

    def __post_init__(self) -> None:
        if not self.cast:
            raise ValueError("a cast needs at least one name")
        if not self.fallback:
            object.__setattr__(self, "fallback", self.cast[0])

    def canonical(self, name: str) -> str | None:
        wanted = name.strip().casefold()
        for member in self.cast:
            if member.casefold() == wanted:
                return member
        return None

    @classmethod
    def from_names(cls, names: list[str] | tuple[str, ...] | None) -> Voices | None:
        """The voices of a stored cast (a list of names); None for the main agent alone."""
        cast = tuple(n for n in (names or ()) if n and n.strip())
        return cls(cast) if cast else None


def cast_instructions(voices: Voices, roles: dict[str, str] | None = None) -> str:
    """What the model is told about the cast and the format of its answer."""
    roles = roles or {}
    lines = [f"{CAST_HEADER}:"]
    lines += [f"- {name}" + (f": {roles[name]}" if roles.get(name) else "") for name in voices.cast]
    lines.append(
        f"Answer as one to {voices.max_replies} of these speakers, each reply wrapped in its "
        "speaker's tag, for example <Name>reply</Name>. Write nothing outside the tags."
    )
    return "\n".join(lines)


def cast_from_prompt(prompt: str) -> list[str]:
    """The names listed by :func:`cast_instructions` in a system prompt (for the demo model)."""
    names: list[str] = []
    lines = prompt.splitlines()
    for index, line in enumerate(lines):
        if line.strip() == f"{CAST_HEADER}:":
            for item in lines[index + 1 :]:
                if not item.startswith("- "):
                    break
                names.append(item[2:].split(":", 1)[0].strip())
            break
    return names


@dataclass
class Segment:
    speaker: str
    text: str = ""


@dataclass
class VoiceSplitter:
    """Feed raw model text in chunks; read the speakers' segments so far."""

    voices: Voices
    segments: list[Segment] = field(default_factory=list)
    raw: str = ""
    _buffer: str = ""
    _mode: str = "between"  # between | in | skip | plain
    _tag: str = ""  # the open tag's name as written (in | skip)
    _started: bool = False  # a tag was seen: text outside tags is not plain text
    _finished: bool = False

    def feed(self, text: str) -> None:
        if not text:
            return
        self.raw += text
        if self._mode == "plain":
            return
        self._buffer += text
        self._consume(final=False)

    def finish(self) -> list[tuple[str, str]]:
        """The replies of the whole text: (speaker, text) pairs, in order."""
        if not self._finished:
            self._finished = True
            if self._mode != "plain":
                self._consume(final=True)
        return self.replies()

    def replies(self) -> list[tuple[str, str]]:
        """The replies so far (final ones once :meth:`finish` was called)."""
        if self._mode == "plain" or (self._finished and not self._kept()):
            text = self.raw.strip()
            return [(self.voices.fallback, text)] if text else []
        return self._kept()

    def _kept(self) -> list[tuple[str, str]]:
        return [(s.speaker, s.text.strip()) for s in self.segments if s.text.strip()]

    # --- the parser ----------------------------------------------------------------------

    def _consume(self, *, final: bool) -> None:
        while self._buffer:
            if self._mode == "between":
                if not self._between(final):
                    return
            elif not self._inside(final):
                return

    def _between(self, final: bool) -> bool:
        """Outside any tag: skip blanks and stray text, open the next tag. False: wait."""
        buffer = self._buffer.lstrip()
        self._buffer = buffer
        if not buffer:
            return False
        if buffer[0] != "<":
            if not self._started:
                self._mode, self._buffer = "plain", ""
                return False
            cut = buffer.find("<")
            self._buffer = buffer[cut:] if cut >= 0 else ""
            return cut >= 0
        end = buffer.find(">", 1, TAG_NAME_MAX + 2)
        if end < 0:
            if not final and len(buffer) < TAG_NAME_MAX + 2:
                return False  # the tag may still be arriving
            if not self._started:
                self._mode, self._buffer = "plain", ""
                return False
            self._buffer = buffer[1:]
            return True
        name = buffer[1:end]
        self._buffer = buffer[end + 1 :]
        if name.startswith("/"):
            return True  # a stray closing tag
        speaker = self.voices.canonical(name)
        if not name.strip() and not self._started:
            self._mode, self._buffer = "plain", ""
            return False
        self._started = True
        self._tag = name
        if speaker is not None and len(self.segments) < self.voices.max_replies:
            self.segments.append(Segment(speaker))
            self._mode = "in"
        else:
            self._mode = "skip"
        return True

    def _inside(self, final: bool) -> bool:
        """In a segment (kept or skipped): text up to its closing tag. False: wait."""
        closing = f"</{self._tag}>"
        buffer = self._buffer
        match = re.search(re.escape(closing), buffer, re.IGNORECASE)
        if match:
            self._take(buffer[: match.start()])
            self._buffer = buffer[match.end() :]
            self._mode = "between"
            return True
        hold = 0 if final else _closing_prefix_length(buffer, closing)
        self._take(buffer[: len(buffer) - hold])
        self._buffer = buffer[len(buffer) - hold :]
        return False

    def _take(self, text: str) -> None:
        if self._mode == "in" and text:
            self.segments[-1].text += text


def _closing_prefix_length(buffer: str, closing: str) -> int:
    """How much of the buffer's end could be the start of ``closing`` (held back)."""
    for length in range(min(len(buffer), len(closing) - 1), 0, -1):
        if buffer[-length:].lower() == closing[:length].lower():
            return length
    return 0


def split_reply(voices: Voices, text: str) -> list[tuple[str, str]]:
    """The replies in a whole text (what the streaming parser ends with)."""
    splitter = VoiceSplitter(voices)
    splitter.feed(text)
    return splitter.finish()
