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

# The system prompt of the optional moderation check (a class's guardrails): one short
# call per message; the model answers "OK" or "FLAG: <reason>" (MODERATION_FLAG).
MODERATION_PROMPT = (
    "You are a safety checker for a school class chat. The user message is one message of "
    "that chat, written by a student or by an AI persona. If a teacher should look at it "
    "(self-harm, violence, bullying, sexual content, hate, personal data, dangerous advice), "
    "answer with one line: FLAG: followed by a short reason. Otherwise answer exactly: OK"
)
MODERATION_FLAG = "FLAG:"
MODERATION_OK = "OK"


def moderation_verdict(answer: str) -> str | None:
    """The reason of a "FLAG: <reason>" answer, or None for anything else (OK included)."""
    first = (answer or "").strip().splitlines()[0].strip() if (answer or "").strip() else ""
    if not first.upper().startswith(MODERATION_FLAG):
        return None
    return first[len(MODERATION_FLAG) :].strip() or "flagged by the model check"


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


# Added to the system prompt of the runs of a chat whose language is not English
# (chat.runhost.setup); the offline demo model answers in Chinese when it sees this one.
CHINESE_LINE = (
    "The user's interface is in Simplified Chinese: answer in Simplified Chinese (简体中文) "
    "unless they write in another language."
)
LANGUAGE_LINES = {"zh-hans": CHINESE_LINE}


def language_line(code: str) -> str:
    """The system prompt's line asking for answers in the chat's language ("" for English)."""
    return LANGUAGE_LINES.get((code or "").lower(), "")
