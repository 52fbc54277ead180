"""Texts the agent sends the model besides the user's own words.

They live here, not in ``chat.agent``, so the offline demo model (``chat.llm.demo``)
can recognise them without the model layer importing the agent layer. The compaction
summary prompt is ``chat.core.compact.SUMMARY_INSTRUCTIONS``.

Pure Python: no Django here.
"""

from __future__ import annotations

# The system prompt of a sub-agent started by the ``delegate`` tool.
SUB_AGENT_PROMPT = (
    "You are a sub-agent working for the main assistant. Do the task you are given, "
    "using your tools if they help, and answer with a short, factual report. "
    "The user does not see your messages directly."
)

# Marks a user message that arrived while the agent was working (in the model's copy only).
USER_APPENDED_PREFIX = "[User appended] "

# Tool results for calls the user refused, or never answered.
DENIED_TEXT = "The user denied this tool call."
DENIED_REASON_LABEL = "Reason:"
EXPIRED_TEXT = "The approval request expired without an answer, so the tool call was not run."


def denied_text(reason: str) -> str:
    """The tool result for a denied call, with the user's reason when they gave one."""
    reason = reason.strip()
    return f"{DENIED_TEXT} {DENIED_REASON_LABEL} {reason}" if reason else DENIED_TEXT


# The short request for a chat's title, sent once after its first reply; the
# conversation follows as "User: …" and "Assistant: …" lines.
TITLE_INSTRUCTIONS = (
    "Write a title of at most six words for the conversation below. "
    "Answer with the title only: no quotes, no full stop."
)
TITLE_USER_LABEL = "User: "
TITLE_ASSISTANT_LABEL = "Assistant: "
