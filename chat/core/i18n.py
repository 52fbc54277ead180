"""Marks texts for translation where Django cannot be imported.

``chat.core``, ``chat.llm`` and ``chat.agent`` are pure Python, yet some of their texts
reach people (an error's message, stored in English in the event log). Marked with
``gettext_noop``, ``make messages`` finds them, and the page translates the stored text
when it shows it (the ``translated`` filter of ``chat_tags``).
"""

from __future__ import annotations


def gettext_noop(message: str) -> str:
    """The text as it is: only a mark for ``makemessages`` (its keyword ``gettext_noop``)."""
    return message
