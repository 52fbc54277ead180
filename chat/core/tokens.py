"""Token estimates: one cheap heuristic used everywhere.

The reference used two different estimates (characters / 3 in the window, JSON bytes / 4
for the compaction threshold), so the window and the compaction trigger disagreed about
the same list. Lyceum uses ONE estimator for window selection, compaction and the
context gauge, so a number shown to the user is the number the loop acted on.

The default, :class:`HeuristicEstimator`, needs no tokenizer download. From the UTF-8
length ``b`` and the character count ``c`` of a text it estimates ``(3b − c) / 8`` tokens:

* ASCII (1 byte): exactly c / 4 — about 4 characters per token for English and code;
* 3-byte characters (CJK, kana, Hangul, most other Asian scripts): 1 token per character;
* 2-byte characters (accented Latin, Cyrillic, Greek, Arabic, Hebrew): ~0.6 per character,
  since BPE vocabularies split those scripts more finely than English;
* 4-byte characters (emoji, rare CJK): ~1.4 per character;
* per message a small fixed overhead (role, separators), per tool call its name and
  arguments plus a little framing, and a flat amount per attached image.

Speed matters (the window estimates every message of long chats): an ASCII string costs O(1)
(CPython records "is ASCII" in the string header), other strings one UTF-8 encode, and
strings over 8,192 characters are estimated from an evenly spread sample of 4,096 to 8,192
characters, so no message costs more than a few microseconds.

It is deliberately coarse; callers leave headroom (see
:func:`chat.core.window.limits_for_context_window`). To plug in a real tokenizer, implement
:class:`TokenEstimator` and call :func:`set_estimator` once at start-up.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from chat.core.messages import ChatMessage

MESSAGE_OVERHEAD_TOKENS = 4
TOOL_CALL_OVERHEAD_TOKENS = 3
IMAGE_TOKENS = 800  # roughly one high-detail tile set; images are never persisted

SAMPLE_ABOVE_CHARS = 8_192
SAMPLE_CHARS = 4_096


class TokenEstimator(Protocol):
    def text_tokens(self, text: str) -> int: ...

    def message_tokens(self, message: ChatMessage) -> int: ...


class HeuristicEstimator:
    """The default estimator (see the module docstring for the rules)."""

    def text_tokens(self, text: str) -> int:
        length = len(text)
        if text.isascii():  # O(1) in CPython, and the common case
            return (length + 3) // 4
        if length > SAMPLE_ABOVE_CHARS:
            sample = text[:: length // SAMPLE_CHARS]
            sample_bytes = len(sample.encode("utf-8", "surrogatepass"))
            return -(-(3 * sample_bytes - len(sample)) * length // (8 * len(sample)))
        utf8_bytes = len(text.encode("utf-8", "surrogatepass"))
        return (3 * utf8_bytes - length + 7) // 8

    def message_tokens(self, message: ChatMessage) -> int:
        content = message.content
        # ASCII cases inlined: this runs for every message of every window selection.
        if content.isascii():
            total = MESSAGE_OVERHEAD_TOKENS + (len(content) + 3) // 4
        else:
            total = MESSAGE_OVERHEAD_TOKENS + self.text_tokens(content)
        if message.reasoning_content:
            total += self.text_tokens(message.reasoning_content)
        if message.tool_calls:
            for call in message.tool_calls:
                name, arguments = call.name, call.arguments
                total += TOOL_CALL_OVERHEAD_TOKENS
                if name.isascii() and arguments.isascii():
                    total += (len(name) + 3) // 4 + (len(arguments) + 3) // 4
                else:
                    total += self.text_tokens(name) + self.text_tokens(arguments)
        if message.images:
            total += IMAGE_TOKENS * len(message.images)
        return total


_active: TokenEstimator = HeuristicEstimator()


def set_estimator(estimator: TokenEstimator) -> TokenEstimator:
    """Replace the process-wide estimator; returns the previous one (to restore it)."""
    global _active
    previous, _active = _active, estimator
    return previous


def get_estimator() -> TokenEstimator:
    return _active


def estimate_text_tokens(text: str) -> int:
    return _active.text_tokens(text)


def estimate_message_tokens(message: ChatMessage) -> int:
    return _active.message_tokens(message)


def estimate_each(messages: list[ChatMessage]) -> list[int]:
    """Per-message estimates, in order (the window's input)."""
    estimate = _active.message_tokens
    if type(_active) is not HeuristicEstimator:
        return [estimate(m) for m in messages]
    # The default estimator's commonest case (plain ASCII text) inlined: a call per
    # message was half the cost of selecting a window over a long chat.
    overhead = MESSAGE_OVERHEAD_TOKENS
    return [
        overhead + (len(m.content) + 3) // 4
        if not m.tool_calls and not m.reasoning_content and not m.images and m.content.isascii()
        else estimate(m)
        for m in messages
    ]


def estimate_tokens(messages: Iterable[ChatMessage]) -> int:
    estimate = _active.message_tokens
    return sum(estimate(m) for m in messages)
