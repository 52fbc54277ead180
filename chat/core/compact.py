"""Compaction helpers: micro compaction and the pieces of LLM-summary (auto) compaction.

Pure functions: the agent loop makes the provider call, runs the hooks and writes the
``restore`` event; this module decides *what* to send and *what* the context becomes.

Shape of the context after auto compaction (:func:`compacted_context`)::

    user  (5th newest user message)   ┐
    ...                               ├ the last 5 user messages, original order
    user  (newest user message)       ┘
    assistant  tool_calls=[compact(id=compact_<n>, {"reason": "auto_compact"})]
    tool       tool_call_id=compact_<n>: "[Context compacted: ...]\\n\\n<summary>"

Why a tool-call / tool-result pair rather than a user summary + assistant "Understood":

* the pair is complete (one call, its one result), so ``sanitize`` keeps it and strict
  providers see no orphan call; it is also what the context channel persists, so the
  summary stays visible to the model in every later turn;
* the list ends on a tool result, the natural point for the model to continue: compaction
  usually happens mid-run, and ending on an assistant message would be read as a prefill
  (or rejected) by several providers;
* ``compact`` is a key tool (:data:`chat.core.window.KEY_TOOLS`), so window selection
  protects the group and micro compaction never shrinks the summary.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from chat.core.messages import ChatMessage, Role, ToolCall
from chat.core.tokens import estimate_tokens
from chat.core.window import is_exempt_tool, limits_for_context_window

MICRO_COMPACT_MIN_CHARS = 800  # results longer than this (in characters) get replaced
SUMMARY_INPUT_MAX_CHARS = 80_000
SUMMARY_MAX_OUTPUT_TOKENS = 20_000  # for the caller's provider request
COMPACT_KEEP_RECENT_USER = 5
COMPACT_TOOL_NAME = "compact"
EMPTY_SUMMARY = "(empty summary)"
PROTECTED_CONTEXT_HEADER = "[Protected Context — MUST preserve in full]:"
DEFAULT_AUTO_COMPACT_THRESHOLD = 204_800  # tokens, the reference default

SUMMARY_INSTRUCTIONS = """\
Your task is to write a detailed summary of the conversation below so that the work can \
continue without it. The summary replaces the conversation: anything you leave out is lost.

Write these nine sections, with these headings:

1. Primary Request — every explicit request and intent of the user, in detail.
2. Key Concepts — the technical concepts, technologies and frameworks that came up.
3. Files and Code — every file or code section examined, created or changed: why it \
matters, what changed, and the important snippets verbatim.
4. Errors and Fixes — each error met and how it was fixed, including user feedback on it.
5. Problem Solving — problems solved so far and troubleshooting still under way.
6. Active Workflows — skills, procedures or instructions currently being followed, with \
their constraints; quote exactly where you left off. This section matters most: the work \
must resume precisely at that point.
7. Pending Tasks — everything the user asked for that is not done yet.
8. Current Work — what was being done immediately before this summary, with file names and \
code; quote the most recent messages where useful.
9. Next Step — the single next step, directly in line with the user's most recent request \
and the current work. Do not start anything the user did not ask for.

Be precise and complete rather than short. The conversation follows as JSON \
(it may be truncated at the end):
"""


def _tool_names_by_call_id(messages: Iterable[ChatMessage]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        if message.role == Role.ASSISTANT and message.tool_calls:
            for call in message.tool_calls:
                names[call.id] = call.name
    return names


def micro_compact(
    messages: list[ChatMessage],
    keep_recent: int = 10,
    exempt_tools: Iterable[str] = frozenset(),
) -> tuple[list[ChatMessage], int]:
    """Replace old, large tool results by ``[Previous: used <tool>]``; no API call.

    The newest ``keep_recent`` tool results are left alone, as are results of exempt tools
    (key tools ∪ ``exempt_tools``). Returns a new list and the number of results replaced;
    replaced messages are copies, so the input list and its messages are never mutated.
    """
    tool_indices = [i for i, m in enumerate(messages) if m.role == Role.TOOL]
    old_count = len(tool_indices) - max(0, keep_recent)
    if old_count <= 0:
        return list(messages), 0

    exempt = frozenset(exempt_tools)
    names = _tool_names_by_call_id(messages)
    result = list(messages)
    replaced = 0
    for index in tool_indices[:old_count]:
        message = messages[index]
        if len(message.content) <= MICRO_COMPACT_MIN_CHARS:
            continue
        name = names.get(message.tool_call_id or "") or "unknown"
        if is_exempt_tool(name, exempt):
            continue
        result[index] = message.copy(content=f"[Previous: used {name}]")
        replaced += 1
    return result, replaced


def needs_auto_compact(messages: list[ChatMessage], threshold_tokens: int) -> bool:
    """True when the estimate passes the threshold; a threshold ≤ 0 disables auto compaction."""
    return threshold_tokens > 0 and estimate_tokens(messages) > threshold_tokens


def auto_compact_threshold(context_window_tokens: int, reserve_for_output: int) -> int:
    """Compact at 80 % of the history budget window selection allows for this model.

    Below the budget, so a run's growing local list is summarised before a request could
    overflow the model; an unknown window (0) falls back to the reference default.
    """
    budget = limits_for_context_window(context_window_tokens, reserve_for_output)
    return budget * 80 // 100 if budget else DEFAULT_AUTO_COMPACT_THRESHOLD


def serialize_for_summary(messages: list[ChatMessage]) -> str:
    """The conversation as JSON (without display-only metadata), cut to the input limit."""
    rows = []
    for message in messages:
        row = message.to_dict()
        row.pop("extra", None)
        rows.append(row)
    return json.dumps(rows, ensure_ascii=False)[:SUMMARY_INPUT_MAX_CHARS]


def build_summary_request(
    messages: list[ChatMessage], protected_context: str | None = None
) -> list[ChatMessage]:
    """The single user message to send (no tools) to get the compaction summary."""
    text = SUMMARY_INSTRUCTIONS + "\n" + serialize_for_summary(messages)
    if protected_context:
        text += f"\n\n{PROTECTED_CONTEXT_HEADER}\n{protected_context}"
    return [ChatMessage(role=Role.USER, content=text)]


def recent_user_messages(
    messages: list[ChatMessage], count: int = COMPACT_KEEP_RECENT_USER
) -> list[ChatMessage]:
    if count <= 0:
        return []
    return [m for m in messages if m.role == Role.USER][-count:]


def compact_call_id(messages_before: int) -> str:
    return f"compact_{messages_before}"


def compacted_context(messages: list[ChatMessage], summary: str) -> list[ChatMessage]:
    """The context that replaces ``messages`` after compaction (shape in the module doc)."""
    messages_before = len(messages)
    call_id = compact_call_id(messages_before)
    call = ToolCall(
        id=call_id, name=COMPACT_TOOL_NAME, arguments=json.dumps({"reason": "auto_compact"})
    )
    header = f"[Context compacted: {messages_before} messages replaced by this summary]"
    return [
        *recent_user_messages(messages),
        ChatMessage(role=Role.ASSISTANT, content="", tool_calls=[call]),
        ChatMessage(
            role=Role.TOOL,
            content=f"{header}\n\n{summary.strip() or EMPTY_SUMMARY}",
            tool_call_id=call_id,
        ),
    ]


@dataclass
class CompactionResult:
    messages_before: int
    summary: str
    new_messages: list[ChatMessage]
    recent_user_messages: list[ChatMessage]


async def auto_compact(
    messages: list[ChatMessage],
    summarize: Callable[[list[ChatMessage]], Awaitable[str]],
    protected_context: str | None = None,
) -> CompactionResult:
    """Summarise with ``summarize`` (the caller's provider call) and build the new context.

    ``summarize`` receives the request from :func:`build_summary_request` and returns the
    reply text. Its errors propagate: the caller logs them and keeps the uncompacted list.
    """
    request = build_summary_request(messages, protected_context)
    summary = (await summarize(request)).strip() or EMPTY_SUMMARY
    return CompactionResult(
        messages_before=len(messages),
        summary=summary,
        new_messages=compacted_context(messages, summary),
        recent_user_messages=recent_user_messages(messages),
    )
