"""The built-in offline demo model: a scripted provider that needs no network.

It speaks the same :class:`~chat.llm.types.Provider` interface as the OpenAI-compatible
provider, so the whole app (streaming, thinking, tool calls with approval, sub-agents,
code blocks, classroom personas, compaction, errors, Stop) can be tried and tested
offline. It is deterministic: the same request always gives the same chunks. The only
"randomness" is a ``random.Random`` seeded from a hash of the request, used to vary
phrasing. Models: ``demo`` (streams at ``token_delay`` per chunk) and ``demo-fast``
(no delay).

What it answers is decided by the **last message** of the request.

After a tool result (role ``tool``) it writes a final answer that uses the result. A
result containing "denied" is acknowledged ("Understood — I did not write the file
because you denied it: <reason>."), quoting the reason verbatim; a result starting with
"Error" is reported plainly; an expired approval request is said to have expired; a
calculator result gives "The result is <result>.". After the ``compact`` tool result that
carries a compaction summary, it carries on with the newest user message instead.

After a user message (a leading ``[User appended]`` is ignored), the first rule in this
table that matches wins (keywords are case-insensitive whole words):

| you type | the demo model |
| --- | --- |
| `calculate 12*7`, `calc 2^10`, `what is 12*7` | calls `calculator(expression)` |
| `time` | calls `current_time()` |
| `write file notes.md`, `write a file` | calls `write_file(path, content)`: a short markdown draft (asks for approval); add "then read it" to chain a `read_file` |
| `edit file notes.md` | calls `edit_file(path, old, new)`: "Status: draft" → "Status: final" |
| `read file notes.md` / `list files` | calls `read_file(path)` / `list_files()` |
| `delegate …`, `sub-agent …` | calls `delegate(task, label)` with the rest of the message as the task |
| `code` | answers with a Python and a Bash fenced code block |
| `long` | answers with ~800 words (try pressing Stop) |
| `fail` / `fail midway` | errors before any token / after ~20 streamed words |
| `xss` | answers with an XSS corpus (script, event handlers, `javascript:` links, …) |
| `markdown` | answers with headings, a table, lists, emphasis, a quote and inline code |
| anything else | a short friendly answer that quotes you and suggests what to try |

A tool is only called when the request offers it; otherwise the answer says that the tool
is not available. Unless ``request.thinking`` is false, every answer first streams a short
reasoning. Special modes, chosen from the system prompt or the request:

* **sub-agent** (system prompt contains "You are a sub-agent"): a two-sentence report
  starting "Sub-agent report:"; calls `calculator` first when the task holds an expression.
* **persona** (system prompt contains "Respond as the persona <Name>"): one to three
  sentences in that persona's voice about the user's last message.
* **classroom** (system prompt lists a cast, ``chat.core.voices.CAST_HEADER``): one to
  three personas as ``<Name>…</Name>`` segments; see :mod:`chat.llm.demo_classroom`.
* **compaction** (last user message contains "Primary Request"): a nine-section summary
  naming the first user messages of the JSON transcript and how many messages it held.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from chat.core.channels import strip_agent_xml_tag
from chat.core.messages import ChatMessage, Role, ToolCall
from chat.llm import demo_classroom
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    ProviderError,
    ReasoningDelta,
    StreamChunk,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)

DEMO_MODELS = ["demo", "demo-fast"]
FAST_MODEL = "demo-fast"
SUB_AGENT_MARKER = "you are a sub-agent"
SUB_AGENT_PREFIX = "Sub-agent report:"
SUMMARY_MARKER = "primary request"
COMPACT_TOOL = "compact"  # the tool-call pair that carries a compaction summary in context
DEFAULT_FILE = "notes.md"
DRAFT_MARKER, FINAL_MARKER = "Status: draft", "Status: final"
DEFAULT_DELEGATE_TASK = "Research the main topic of this conversation and report three key facts."
FAIL_MESSAGE = "The demo model failed on request."
FAIL_MIDWAY_MESSAGE = "The demo model failed midway through its reply, on request."


class Failure(StrEnum):
    BEFORE_ANY_TOKEN = "before_any_token"
    MIDWAY = "midway"


@dataclass(frozen=True, slots=True)
class PlannedToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DemoReply:
    """Everything one response will contain, decided before the first chunk is sent."""

    reasoning: str
    text: str = ""
    tool_call: PlannedToolCall | None = None
    failure: Failure | None = None


@dataclass(slots=True)
class _Turn:
    """The request plus what the rules need to look up in it."""

    request: ChatRequest
    rng: random.Random
    offered: dict[str, dict[str, Any]]  # tool name → its "function" spec


# --- the provider -------------------------------------------------------------------------


class DemoProvider:
    """Scripted offline model behind the :class:`~chat.llm.types.Provider` interface."""

    def __init__(self, name: str = "demo", *, token_delay: float = 0.03, chunk_words: int = 1):
        if token_delay < 0:
            raise ValueError("token_delay must be >= 0")
        if chunk_words < 1:
            raise ValueError("chunk_words must be >= 1")
        self.name = name
        self.token_delay = token_delay
        self.chunk_words = chunk_words

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        delay = 0.0 if request.model == FAST_MODEL else self.token_delay
        return self._generate(request, delay)

    async def complete(self, request: ChatRequest) -> StreamEnd:
        async for chunk in self._generate(request, 0.0):
            if isinstance(chunk, StreamEnd):
                return chunk
        raise ProviderError(ErrorCategory.MALFORMED_STREAM)  # unreachable: the stream always ends

    async def list_models(self) -> list[str]:
        return list(DEMO_MODELS)

    async def _generate(self, request: ChatRequest, delay: float) -> AsyncIterator[StreamChunk]:
        reply = plan_reply(request)
        if reply.failure is Failure.BEFORE_ANY_TOKEN:
            raise ProviderError(ErrorCategory.PROVIDER_ERROR, FAIL_MESSAGE)
        reasoning = reply.reasoning if request.thinking else ""
        output_words = 0
        for piece in split_into_chunks(reasoning, self.chunk_words):
            await _pause(delay)
            output_words += 1
            yield ReasoningDelta(piece)
        for piece in split_into_chunks(reply.text, self.chunk_words):
            await _pause(delay)
            output_words += 1
            yield TextDelta(piece)
        if reply.failure is Failure.MIDWAY:
            raise ProviderError(ErrorCategory.PROVIDER_ERROR, FAIL_MIDWAY_MESSAGE, streamed=True)
        tool_calls: list[ToolCall] = []
        if reply.tool_call is not None:
            call_id = tool_call_id(request)
            await _pause(delay)
            yield ToolCallStarted(index=0, id=call_id, name=reply.tool_call.name)
            arguments = json.dumps(reply.tool_call.arguments, ensure_ascii=False)
            tool_calls.append(ToolCall(id=call_id, name=reply.tool_call.name, arguments=arguments))
            output_words += max(1, len(arguments) // 4)
        yield StreamEnd(
            finish_reason="tool_calls" if tool_calls else "stop",
            tool_calls=tool_calls,
            usage=Usage(input_tokens=_input_tokens(request), output_tokens=output_words),
            text=reply.text,
            reasoning=reasoning,
        )


async def _pause(delay: float) -> None:
    # Always yield to the loop, even at zero delay, so a cancelled consumer stops at once.
    await asyncio.sleep(delay if delay > 0 else 0)


def split_into_chunks(text: str, words_per_chunk: int) -> list[str]:
    """Cut text into chunks of N words, keeping every whitespace so they join back exactly."""
    body = text.lstrip()
    words = re.findall(r"\S+\s*", body)  # linear, unlike a pattern that starts with \s*
    leading = text[: len(text) - len(body)]
    if not words:
        return [leading] if leading else []
    words[0] = leading + words[0]
    return ["".join(words[i : i + words_per_chunk]) for i in range(0, len(words), words_per_chunk)]


def request_digest(request: ChatRequest) -> str:
    """Stable hash of what decides the answer (not the model id, not the thinking flag)."""
    payload = {
        "system": request.system_prompt,
        "messages": [
            [m.role, m.content, m.tool_call_id, m.sender_name, _calls_as_lists(m.tool_calls)]
            for m in request.messages
        ],
        "tools": sorted(_offered_tools(request)),
    }
    encoded = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()


def tool_call_id(request: ChatRequest) -> str:
    return f"call_demo_{request_digest(request)[:8]}"


def _calls_as_lists(calls: list[ToolCall] | None) -> list[list[str]] | None:
    return None if calls is None else [[c.id, c.name, c.arguments] for c in calls]


def _input_tokens(request: ChatRequest) -> int:
    chars = len(request.system_prompt)
    for message in request.messages:
        chars += len(message.content)
        chars += sum(len(c.name) + len(c.arguments) for c in message.tool_calls or [])
    return chars // 4


# --- planning: which reply for which request ------------------------------------------------


def plan_reply(request: ChatRequest) -> DemoReply:
    """Decide the whole reply from the request. Pure and deterministic."""
    digest = request_digest(request)
    turn = _Turn(
        request=request,
        rng=random.Random(int(digest[:16], 16)),
        offered=_offered_tools(request),
    )
    last = request.messages[-1] if request.messages else None
    sub_agent = SUB_AGENT_MARKER in request.system_prompt.lower()
    if last is not None and last.role == Role.TOOL:
        reply = _reply_to_tool_result(turn, last)
        if reply is not None:
            return _as_sub_agent_report(reply) if sub_agent else reply
        # After a compaction the context ends on the summary: carry on with the user's request.
    text = _last_user_text(request.messages)
    if SUMMARY_MARKER in text.lower():
        return _summary_reply(text)
    if sub_agent:
        return _sub_agent_reply(turn, text)
    persona = _persona_name(request.system_prompt)
    if persona:
        return _persona_reply(turn, persona, text)
    if (voiced := demo_classroom.reply(request.system_prompt, text)) is not None:
        return DemoReply(*voiced)  # classroom mode: a cast in the prompt
    for rule in _USER_RULES:
        reply = rule(turn, text)
        if reply is not None:
            return reply
    return _default_reply(turn, text)


def _offered_tools(request: ChatRequest) -> dict[str, dict[str, Any]]:
    offered: dict[str, dict[str, Any]] = {}
    for spec in request.tools:
        function = spec.get("function", spec)  # accept both OpenAI and flat specs
        if isinstance(function, dict) and function.get("name"):
            offered[str(function["name"])] = function
    return offered


# Messages queued while the agent was busy arrive marked; the mark is not content.
_APPENDED_MARK = re.compile(r"^\[User appended\][ \t]*", re.M)


def _last_user_text(messages: list[ChatMessage]) -> str:
    for message in reversed(messages):
        if message.role == Role.USER:
            content = message.content
            if message.sender_name:
                content = strip_agent_xml_tag(message.sender_name, content)
            return _APPENDED_MARK.sub("", content).strip()
    return ""


def _quote(text: str, limit: int = 60) -> str:
    """A short single-line excerpt of the user's text, cut at a word boundary."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0] or flat[:limit]
    return cut + "…"


def _has_word(pattern: str, text: str) -> bool:
    return re.search(rf"\b(?:{pattern})\b", text, re.I) is not None


# --- tool calls ---------------------------------------------------------------------------

# Argument names the demo uses, and the names other tool specs commonly use for the same thing.
_ARGUMENT_SYNONYMS: dict[str, tuple[str, ...]] = {
    "expression": ("expr", "input", "query"),
    "path": ("file_path", "filename", "file", "name"),
    "content": ("text", "contents", "body"),
    "old": ("old_text", "old_string", "old_str", "find", "search"),
    "new": ("new_text", "new_string", "new_str", "replace", "replacement"),
    "task": ("prompt", "instructions", "description"),
    "label": ("name", "title", "slug"),
}


def _fit_arguments(spec: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Rename arguments to the spec's property names when the spec spells them differently."""
    properties = (spec.get("parameters") or {}).get("properties") or {}
    if not properties:
        return arguments
    fitted: dict[str, Any] = {}
    for key, value in arguments.items():
        target = key
        if key not in properties:
            candidates = [n for n in _ARGUMENT_SYNONYMS.get(key, ()) if n in properties]
            if candidates and candidates[0] not in fitted:
                target = candidates[0]
        fitted[target] = value
    return fitted


def _call_tool(
    turn: _Turn, name: str, arguments: dict[str, Any], purpose: str, asked: str
) -> DemoReply:
    """A tool call when the request offers the tool, otherwise a text saying it cannot."""
    spec = turn.offered.get(name)
    if spec is None:
        return DemoReply(
            reasoning=(
                f"The user asked me to {asked}, which needs the {name} tool. "
                "That tool is not offered in this chat, so I will say so instead of calling it."
            ),
            text=(
                f"I would use the `{name}` tool to {purpose}, but that tool is not available "
                "in this chat, so I cannot do it here."
            ),
        )
    return DemoReply(
        reasoning=(
            f"The user asked me to {asked}. I will call the {name} tool to {purpose} "
            "and answer once I have its result."
        ),
        tool_call=PlannedToolCall(name, _fit_arguments(spec, arguments)),
    )


# --- rules for a user message, in priority order -------------------------------------------

_CALC_KEYWORD = re.compile(r"\b(?:calculate|calc)\b[\s:]*(?P<rest>.*)", re.I | re.S)
# Every pattern here is linear in the input: user text can be long and hostile.
_QUESTION_PREFIX = re.compile(r"^\s*(?:what\s+is|what's|whats|how\s+much\s+is|compute)\b", re.I)
_ARITHMETIC_RUN = re.compile(r"[-+*/%^().\d \t]+")
_OPERATOR = re.compile(r"[\d)][ \t]*(?:\*\*|[-+*/%^])[ \t(+-]*[\d.(]")
_FILE_STOPWORDS = {
    "a", "about", "an", "and", "for", "in", "it", "of", "on", "please", "that", "the",
    "then", "to", "with",
}  # fmt: skip


def _trimmed_expression(run: str) -> str:
    """A run of arithmetic characters without the operators or dots dangling at its ends."""
    starts = [i for i, ch in enumerate(run) if ch in "-+(.0123456789"]
    ends = [i for i, ch in enumerate(run) if ch in ")0123456789"]
    if not starts or not ends or ends[-1] < starts[0]:
        return ""
    return run[starts[0] : ends[-1] + 1].strip()


def _arithmetic_in(text: str) -> str | None:
    """The longest arithmetic expression in the text (digits with an operator), if any."""
    spans = [_trimmed_expression(run) for run in _ARITHMETIC_RUN.findall(text)]
    spans = [span for span in spans if _OPERATOR.search(span)]
    return max(spans, key=len) if spans else None


def _calculation_requested(text: str) -> str | None:
    candidate = _QUESTION_PREFIX.sub("", text).strip().rstrip("?=!. \t")
    if _ARITHMETIC_RUN.fullmatch(candidate) and _OPERATOR.search(candidate):
        return _trimmed_expression(candidate)
    keyword = _CALC_KEYWORD.search(text)
    if keyword is None:
        return None
    rest = keyword["rest"]
    found = _arithmetic_in(rest)
    if found:
        return found
    first_line = (rest.split("?")[0].splitlines() or [""])[0]
    return first_line.strip().rstrip(".!").strip() or None


def _rule_calculator(turn: _Turn, text: str) -> DemoReply | None:
    expression = _calculation_requested(text)
    if expression is None:
        return None
    return _call_tool(
        turn,
        "calculator",
        {"expression": expression},
        purpose=f"evaluate {expression}",
        asked=f"calculate {expression}",
    )


def _rule_time(turn: _Turn, text: str) -> DemoReply | None:
    if not _has_word("time", text):
        return None
    return _call_tool(
        turn, "current_time", {}, purpose="look up the current time", asked="tell the time"
    )


def _file_request(verb: str, text: str) -> tuple[bool, str | None]:
    """Whether the text says "<verb> [a] file [named] <name>", and the name if it gives one."""
    match = re.search(
        rf"\b{verb}\s+(?:(?:a|an|the|me|this|my|new|another|short|small)\s+){{0,2}}file\b"
        r"[ \t]*(?:(?:named|called)\s+)?[\"'`]?(?P<name>[^\s,;!?\"'`]+)?",
        text,
        re.I,
    )
    if match is None:
        return False, None
    name = (match["name"] or "").rstrip(".:")
    if not name or name.lower() in _FILE_STOPWORDS:
        return True, None
    return True, name


def _draft_document(path: str, user_text: str) -> str:
    stem = re.sub(r"[-_]+", " ", path.rsplit("/", 1)[-1].split(".")[0]).strip() or "Notes"
    return (
        f"# {stem.title()}\n\n"
        f"{DRAFT_MARKER}\n\n"
        "Written by the Lyceum offline demo model.\n\n"
        "## What you asked\n\n"
        f"> {_quote(user_text, 120)}\n\n"
        "## Next steps\n\n"
        "- Read this file back.\n"
        "- Edit it to mark it final.\n"
    )


def _rule_write_file(turn: _Turn, text: str) -> DemoReply | None:
    asked, name = _file_request("write", text)
    if not asked:
        return None
    path = name or DEFAULT_FILE
    arguments = {"path": path, "content": _draft_document(path, text)}
    return _call_tool(
        turn, "write_file", arguments, purpose=f"write {path}", asked=f"write the file {path}"
    )


def _rule_edit_file(turn: _Turn, text: str) -> DemoReply | None:
    asked, name = _file_request("edit", text)
    if not asked:
        return None
    path = name or DEFAULT_FILE
    arguments = {"path": path, "old": DRAFT_MARKER, "new": FINAL_MARKER}
    return _call_tool(
        turn, "edit_file", arguments, purpose=f"mark {path} final", asked=f"edit {path}"
    )


def _rule_read_or_list_files(turn: _Turn, text: str) -> DemoReply | None:
    asked, name = _file_request("read", text)
    if asked:
        path = name or DEFAULT_FILE
        return _call_tool(
            turn, "read_file", {"path": path}, purpose=f"read {path}", asked=f"read {path}"
        )
    if re.search(r"\blist\s+(?:the\s+|my\s+|all\s+)?files\b", text, re.I):
        return _call_tool(turn, "list_files", {}, purpose="list the files", asked="list the files")
    return None


def _slug(text: str) -> str:
    words = [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _FILE_STOPWORDS]
    return "-".join(words[:3])[:30].strip("-") or "research"


def _rule_delegate(turn: _Turn, text: str) -> DemoReply | None:
    match = re.search(r"\b(?:delegate|sub-?agents?)\b(?P<rest>.*)", text, re.I | re.S)
    if match is None:
        return None
    rest = re.sub(r"^[\s:,.-]*(?:(?:to|this|it|that)\b[\s:,-]*)*", "", match["rest"]).strip()
    task = rest or DEFAULT_DELEGATE_TASK
    label = _slug(rest) if rest else "research"
    return _call_tool(
        turn,
        "delegate",
        {"task": task, "label": label},
        purpose="hand the task to a sub-agent",
        asked=f"delegate “{_quote(task)}”",
    )


def _rule_code(turn: _Turn, text: str) -> DemoReply | None:
    if not _has_word("code", text):
        return None
    return DemoReply(
        reasoning=(
            f"The user asked for code: “{_quote(text)}”. I will show a short Python "
            "function and a shell command that runs it, with a sentence on each."
        ),
        text=_code_answer(text),
    )


def _rule_long(turn: _Turn, text: str) -> DemoReply | None:
    if not _has_word("long", text):
        return None
    return DemoReply(
        reasoning=(
            "The user asked for a long answer. I will write several sections and a list "
            "so that there is time to watch it stream and to press Stop."
        ),
        text=_long_answer(text),
    )


def _rule_fail(turn: _Turn, text: str) -> DemoReply | None:
    if re.search(r"\bfail[\s-]+mid-?way\b", text, re.I):
        return DemoReply(
            reasoning="The user asked me to fail midway. I will stream some words, then fail.",
            text=(
                "This reply starts normally and streams a few words so that you can see "
                "partial text arrive before the demo model fails on purpose right about"
            ),
            failure=Failure.MIDWAY,
        )
    if _has_word("fail", text):
        return DemoReply(reasoning="", failure=Failure.BEFORE_ANY_TOKEN)
    return None


def _rule_xss(turn: _Turn, text: str) -> DemoReply | None:
    if not _has_word("xss", text):
        return None
    return DemoReply(
        reasoning=(
            "The user asked for an XSS test. I will reply with markdown and HTML that would run "
            "script if the app rendered it unsafely."
        ),
        text=XSS_CORPUS,
    )


def _rule_markdown(turn: _Turn, text: str) -> DemoReply | None:
    if not _has_word("markdown", text):
        return None
    return DemoReply(
        reasoning=(
            "The user wants to see markdown. I will use headings, a table, lists, emphasis, "
            "a blockquote and inline code in one reply."
        ),
        text=_markdown_answer(text),
    )


_USER_RULES: tuple[Callable[[_Turn, str], DemoReply | None], ...] = (
    _rule_calculator,
    _rule_time,
    _rule_write_file,
    _rule_edit_file,
    _rule_read_or_list_files,
    _rule_delegate,
    _rule_code,
    _rule_long,
    _rule_fail,
    _rule_xss,
    _rule_markdown,
)

_SUGGESTIONS = (
    "“calculate 12*7”",
    "“what time is it”",
    "“write a file”",
    "“show me some code”",
    "“give me a long answer”",
    "“delegate a research task”",
    "“show markdown”",
    "“fail midway”",
)
_OPENERS = ("Thanks for your message", "Got it", "Hello", "Good to hear from you")


def _default_reply(turn: _Turn, text: str) -> DemoReply:
    suggestions = turn.rng.sample(_SUGGESTIONS, 3)
    tips = f"Try {suggestions[0]}, {suggestions[1]} or {suggestions[2]} to see what Lyceum can do."
    if not text:
        return DemoReply(
            reasoning="The user sent an empty message. I will greet them and suggest things to try.",
            text=f"Hello! I am Lyceum's offline demo model. {tips}",
        )
    opener = turn.rng.choice(_OPENERS)
    return DemoReply(
        reasoning=(
            f"The user wrote “{_quote(text)}”. No demo keyword matched, so I will reply "
            "briefly and suggest a few things to try."
        ),
        text=(
            f"{opener} — you wrote “{_quote(text)}”. I am Lyceum's offline demo model, so I "
            f"answer from a fixed script rather than real understanding. {tips}"
        ),
    )


# --- replies to a tool result ---------------------------------------------------------------

_DENIED_ACTIONS = {
    "write_file": "write the file",
    "edit_file": "edit the file",
    "read_file": "read the file",
    "list_files": "list the files",
    "calculator": "run the calculation",
    "current_time": "check the time",
    "delegate": "start the sub-agent",
}
_ERROR_RESULT = re.compile(r"\s*\[?(?:error|tool error|failed|exception|timed out)\b", re.I)
_ERROR_PREFIX = re.compile(r"^\[?(?:tool )?error\]?:?\s*", re.I)


def _originating_call(messages: list[ChatMessage], call_id: str | None) -> ToolCall | None:
    """The assistant tool call a result answers (by id; the latest call as a fallback)."""
    latest: ToolCall | None = None
    for message in reversed(messages):
        for call in message.tool_calls or []:
            if call.id == call_id:
                return call
            latest = latest or call
    return latest


def _parsed_arguments(call: ToolCall | None) -> dict[str, Any]:
    try:
        parsed = json.loads(call.arguments) if call is not None else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _reply_to_tool_result(turn: _Turn, result: ChatMessage) -> DemoReply | None:
    """The answer that uses a tool result; None after a compaction, which is no answer."""
    call = _originating_call(turn.request.messages, result.tool_call_id)
    name = call.name if call is not None else "unknown"
    if name == COMPACT_TOOL:
        return None
    arguments = _parsed_arguments(call)
    content = result.content.strip()
    first_line = (content.splitlines() or [""])[0]
    # The denial sentence comes first; a file that merely contains "denied" is not a denial.
    if "denied" in first_line.lower():
        return _denial_reply(name, content)
    if "approval request expired" in first_line.lower():
        action = _DENIED_ACTIONS.get(name, f"run {name}")
        return DemoReply(
            reasoning=f"Nobody answered the approval request for {name}. I will say so.",
            text=f"The approval request expired, so I did not {action}. Ask again when ready.",
        )
    if _ERROR_RESULT.match(content):
        detail = _ERROR_PREFIX.sub("", first_line).strip() or "no details"
        ending = "" if detail[-1] in ".!?" else "."
        return DemoReply(
            reasoning=f"The {name} tool reported an error. I will tell the user plainly.",
            text=f"The `{name}` tool reported an error, so that step did not work: {detail}{ending}",
        )
    reasoning = f"The {name} tool returned a result. I will use it to answer the user."
    chained = _chained_read(turn, name, arguments)
    if chained is not None:
        return chained
    return DemoReply(reasoning=reasoning, text=_result_text(name, arguments, content))


def _denial_reply(tool_name: str, content: str) -> DemoReply:
    action = _DENIED_ACTIONS.get(tool_name, f"run {tool_name}")
    reason_match = re.search(r"reason:\s*(?P<reason>.*)", content, re.I | re.S)
    reason = reason_match["reason"].strip() if reason_match else ""
    if reason:
        ending = "" if reason[-1] in ".!?" else "."
        text = f"Understood — I did not {action} because you denied it: {reason}{ending}"
    else:
        text = f"Understood — I did not {action} because you denied it."
    return DemoReply(
        reasoning=(
            f"The user denied the {tool_name} call. I will acknowledge that and not try it again."
        ),
        text=text + " Tell me if you would like me to do something else instead.",
    )


def _chained_read(turn: _Turn, tool_name: str, arguments: dict[str, Any]) -> DemoReply | None:
    """After writing a file, read it back when the user's request said "then read it"."""
    if tool_name != "write_file" or "read_file" not in turn.offered:
        return None
    request_text = _last_user_text(turn.request.messages)
    if not re.search(r"\b(?:then|and)\s+read\b", request_text, re.I):
        return None
    path = str(arguments.get("path") or DEFAULT_FILE)
    return _call_tool(
        turn, "read_file", {"path": path}, purpose=f"read {path} back", asked=f"read {path}"
    )


def _fenced(content: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", content)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{content}\n{fence}"


def _calculator_value(content: str) -> str:
    try:
        parsed = json.loads(content)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "result" in parsed:
        return str(parsed["result"])
    return content.rsplit("=", 1)[-1].strip() or content


def _result_text(tool_name: str, arguments: dict[str, Any], content: str) -> str:
    path = str(arguments.get("path") or DEFAULT_FILE)
    if tool_name == "calculator":
        return f"The result is {_calculator_value(content)}."
    if tool_name == "current_time":
        return f"The current time is {content}."
    if tool_name == "write_file":
        return (
            f"Done — I wrote `{path}` as a short draft. Ask me to “edit file {path}” to mark it "
            f"final, or to “read file {path}” to see it."
        )
    if tool_name == "edit_file":
        return f"I updated `{path}`: “{DRAFT_MARKER}” is now “{FINAL_MARKER}”."
    if tool_name == "read_file":
        return f"Here is `{path}`:\n\n{_fenced(content[:2000])}"
    if tool_name == "list_files":
        return f"These are the files I can see:\n\n{_fenced(content[:2000])}"
    if tool_name == "delegate":
        quoted = "\n".join(f"> {line}" for line in content[:2000].splitlines())
        return f"The sub-agent finished. Here is what it reported:\n\n{quoted}"
    return f"The `{tool_name}` tool returned: {_quote(content, 200)}"


# --- special modes: sub-agent, persona, compaction summary --------------------------------

_FINDINGS = (
    "the most useful first step is to state the question precisely",
    "the answer depends mostly on the sources that are easiest to check",
    "the task splits naturally into three small parts",
    "nothing in it needs more than a careful reading",
)


def _sub_agent_reply(turn: _Turn, task: str) -> DemoReply:
    failing = _rule_fail(turn, task)  # failures stay testable inside a sub-agent too
    if failing is not None:
        return failing
    expression = _arithmetic_in(task)
    if expression is not None and "calculator" in turn.offered:
        return _call_tool(
            turn,
            "calculator",
            {"expression": expression},
            purpose=f"evaluate {expression}",
            asked=f"work on a task that needs {expression}",
        )
    finding = turn.rng.choice(_FINDINGS)
    return DemoReply(
        reasoning=(
            f"I am a sub-agent working on “{_quote(task)}”. I will report briefly to the lead."
        ),
        text=(
            f"{SUB_AGENT_PREFIX} I looked into “{_quote(task)}” and found that {finding}. "
            "Nothing else needs the lead's attention."
        ),
    )


def _as_sub_agent_report(reply: DemoReply) -> DemoReply:
    if reply.tool_call is not None or reply.text.startswith(SUB_AGENT_PREFIX):
        return reply
    return DemoReply(reasoning=reply.reasoning, text=f"{SUB_AGENT_PREFIX} {reply.text}")


# Case-sensitive after the phrase: a name's later words must be capitalised ("Ms. Rivera").
_PERSONA = re.compile(
    r"(?i:respond as the persona)\s*(?:(?:named|called)\s+)?[:\s]*"
    r"(?:[\"“](?P<quoted>[^\"”]+)[\"”]"
    r"|(?P<name>(?:(?:Mr|Mrs|Ms|Mx|Dr|Prof)\.?\s+)?[^\W\d_][\w'’-]*(?:\s+[A-Z][\w'’-]*)*))"
)
_PERSONA_LINES = (
    "{name} here. About “{quote}”: that is a good place to start — what do you think "
    "the first step is?",
    "As {name}, I would take “{quote}” one piece at a time. How did you get there?",
    "I like that question: “{quote}”. Let's compare our ideas before we decide — I'm {name}, "
    "by the way.",
)


def _persona_name(system_prompt: str) -> str | None:
    match = _PERSONA.search(system_prompt)
    if match is None:
        return None
    return (match["quoted"] or match["name"] or "").strip() or None


def _persona_reply(turn: _Turn, name: str, text: str) -> DemoReply:
    line = turn.rng.choice(_PERSONA_LINES)
    return DemoReply(
        reasoning=(
            f"I am speaking as {name}. The student said “{_quote(text)}”; "
            "I will answer in character in a sentence or two."
        ),
        text=line.format(name=name, quote=_quote(text or "…")),
    )


_JSON_ROLE_THEN_CONTENT = re.compile(
    r'"role"\s*:\s*"(?P<role>\w+)"\s*,\s*"content"\s*:\s*"(?P<content>(?:[^"\\]|\\.)*)"'
)
_JSON_CONTENT_THEN_ROLE = re.compile(
    r'"content"\s*:\s*"(?P<content>(?:[^"\\]|\\.)*)"\s*,\s*"role"\s*:\s*"(?P<role>\w+)"'
)


def _json_string(escaped: str) -> str:
    try:
        return str(json.loads(f'"{escaped}"'))
    except ValueError:
        return escaped


def _transcript_user_messages(prompt: str) -> list[str]:
    """User contents found in the JSON transcript, by substring matching (no full parse)."""
    found: list[tuple[int, str]] = []
    for pattern in (_JSON_ROLE_THEN_CONTENT, _JSON_CONTENT_THEN_ROLE):
        for match in pattern.finditer(prompt):
            if match["role"] == Role.USER:
                content = _json_string(match["content"])
                found.append((match.start(), _APPENDED_MARK.sub("", content).strip()))
    return [content for _, content in sorted(found)]


def _summary_reply(prompt: str) -> DemoReply:
    users = _transcript_user_messages(prompt)
    count = len(re.findall(r'"role"\s*:', prompt))
    if users:
        primary = "; then ".join(f"“{_quote(u, 160)}”" for u in users[:3])
        current = f"“{_quote(users[-1], 160)}”"
    else:
        primary = current = "(no user message found in the transcript)"
    return DemoReply(
        reasoning="I was asked to summarise the conversation. I will fill in the nine sections.",
        text=(
            "## Conversation summary\n\n"
            f"1. Primary Request: the user asked {primary}.\n"
            "2. Key Concepts: a conversation with Lyceum's offline demo model.\n"
            "3. Files and Code: none recorded by the demo model.\n"
            "4. Errors and Fixes: none recorded.\n"
            "5. Problem Solving: the demo model answered from its script.\n"
            "6. Active Skills/Workflows: none.\n"
            "7. Pending Tasks: none known.\n"
            f"8. Current Work: the latest user message was {current}.\n"
            "9. Next Step: continue with the user's next message.\n\n"
            f"Messages summarised: {count}."
        ),
    )


# --- fixed texts ----------------------------------------------------------------------------


def _code_answer(text: str) -> str:
    return (
        f"Here is a small example for “{_quote(text)}”. The Python function counts the most "
        "common words in a text:\n\n"
        "```python\n"
        "from collections import Counter\n"
        "\n"
        "\n"
        "def top_words(text: str, limit: int = 3) -> list[tuple[str, int]]:\n"
        '    """Return the most common words in ``text``, most frequent first."""\n'
        '    words = [word.strip(".,!?").lower() for word in text.split()]\n'
        "    counts = Counter(word for word in words if word)\n"
        "    return counts.most_common(limit)\n"
        "\n"
        "\n"
        'if __name__ == "__main__":\n'
        '    print(top_words("the cat and the hat and the bat"))\n'
        "```\n\n"
        "Save it as `top_words.py`, then run it from a shell:\n\n"
        "```bash\n"
        "python3 top_words.py\n"
        "# [('the', 3), ('and', 2), ('cat', 1)]\n"
        "```\n\n"
        "`Counter.most_common` does the sorting, so the function stays short; ties keep the "
        "order in which the words first appeared."
    )


def _long_answer(text: str) -> str:
    return (
        f"You asked for something long, so here is a longer answer about “{_quote(text)}”. "
        "It exists mainly so you can watch a reply stream in word by word and press Stop "
        "halfway through. Everything below is written by the offline demo model from a fixed "
        "script, which means the same request always produces the same words in the same "
        "order. That makes it useful for checking how the interface behaves when an answer "
        "runs for a while: whether the page keeps up, whether the scroll position follows the "
        "newest text, and whether stopping keeps the part that already arrived.\n\n"
        "## How streaming works\n\n"
        "A language model does not write a whole answer at once. It produces one small piece "
        "of text at a time, and the server forwards each piece to your browser as soon as it "
        "exists. Lyceum groups these pieces into a few updates per second so the page stays "
        "smooth even when the model is fast. The demo model imitates this by pausing briefly "
        "between words. The pause is configurable, and a second model called demo-fast skips "
        "it entirely, which is handy in automated tests that only care about the final text.\n\n"
        "## What happens when you press Stop\n\n"
        "Stopping a reply is a request to the server, not just a change on the page. The "
        "server cancels the running task, closes the connection to the model provider, and "
        "records the reply as cancelled together with the text it had produced so far. "
        "Nothing is thrown away: if you reload the page, the partial answer is still there, "
        "marked as stopped. A reply ends in exactly one state, so a stopped reply can never "
        "also appear as completed or failed.\n\n"
        "## Things worth trying\n\n"
        "- Ask me to calculate 12*7 and watch a tool call appear.\n"
        "- Ask me to write a file, then approve or deny the request.\n"
        "- Ask me to delegate a task and see a sub-agent report back.\n"
        "- Ask for code to get two fenced blocks you can copy or download.\n"
        "- Ask for markdown to see tables, quotes and lists rendered.\n"
        "- Say fail midway to watch an error arrive after some text.\n"
        "- Close the tab during a long answer and open it again later.\n\n"
        "## Why a scripted model helps\n\n"
        "Real models are wonderful but unpredictable, and they need a network connection, an "
        "account and usually money. A scripted model needs none of that. It lets a teacher "
        "explore the classroom features before any provider is configured, lets a developer "
        "reproduce a bug with the exact same reply every time, and lets the test suite "
        "exercise every path through the agent loop in a fraction of a second. When a real "
        "provider is connected later, nothing else changes: both speak the same interface, so "
        "the rest of the application cannot tell them apart.\n\n"
        "## Under the hood\n\n"
        "Each answer from the demo model is planned before the first word is sent. The plan "
        "is chosen from the last message in the conversation: a tool result gets a reply that "
        "uses it, and a user message is checked against a short list of keywords such as "
        "calculate, time, write file, delegate, code, long and markdown. Anything else gets a "
        "friendly default reply. A hash of the request seeds the few choices the model makes, "
        "such as which suggestions to offer, so variety never costs reproducibility. Then the "
        "text is cut into words and sent one small chunk at a time.\n\n"
        "## Reading long answers\n\n"
        "Long answers are easier to read when they are broken into sections with short "
        "headings, when lists are used for steps or options, and when the most important "
        "sentence comes first in each paragraph. The same advice applies to your own writing. "
        "If you are preparing notes for a class, try putting the question you want to answer "
        "at the top, then the answer in one sentence, and only then the details and examples "
        "that support it. Readers who only skim still leave with the main idea.\n\n"
        "## A short story to pass the hours\n\n"
        "Once there was a lighthouse keeper who wrote one sentence in a notebook every "
        "evening. Most sentences were about the weather; a few were about passing ships; one, "
        "after a long storm, was simply the word enough. Years later a visitor read the "
        "notebook from start to finish in a single afternoon and said it was the best book "
        "she had ever read, because every line had been written by someone who was paying "
        "attention. Good answers, long or short, have that quality.\n\n"
        "## Wrapping up\n\n"
        "That is the end of the long answer. If you pressed Stop before reaching this line, "
        "the part you saw is exactly what the server kept. If you read all of it, thank you "
        "for your patience: ask me something else, or try one of the suggestions above to "
        "explore another part of Lyceum."
    )


def _markdown_answer(text: str) -> str:
    return (
        "# Markdown sampler\n\n"
        f"You asked: *{_quote(text)}*. Here is a bit of **everything** the renderer "
        "should handle.\n\n"
        "## A table\n\n"
        "| tool | asks for approval | example |\n"
        "| --- | :---: | --- |\n"
        "| `calculator` | no | `calculate 12*7` |\n"
        "| `write_file` | yes | `write file notes.md` |\n"
        "| `delegate` | no | `delegate a research task` |\n\n"
        "## Lists\n\n"
        "- **Bold** for what matters\n"
        "- *Italic* for a gentle stress\n"
        "- ***Both*** when you really mean it\n\n"
        "1. First, read the question.\n"
        "2. Then, answer it in one sentence.\n"
        "3. Finally, give an example.\n\n"
        "### A quotation\n\n"
        "> The best way to learn is to explain.\n"
        "> — a teacher, probably\n\n"
        "Inline code looks like `print('hello')`, and a [safe link](https://example.org) "
        "looks like this.\n\n"
        "---\n\n"
        "That is the end of the sampler."
    )


XSS_CORPUS = (
    "Here is an XSS test corpus. Every line below must show up as harmless text or be "
    "removed; none of it may run.\n\n"
    "<script>alert(1)</script>\n\n"
    "<img src=x onerror=alert(1)>\n\n"
    "[click](javascript:alert(1))\n\n"
    "[mixed case](JaVaScRiPt:alert(1))\n\n"
    "[entity](&#106;avascript:alert(1))\n\n"
    "[data url](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)\n\n"
    "[vbscript](vbscript:msgbox(1))\n\n"
    "<svg onload=alert(1)>\n\n"
    '<iframe src="javascript:alert(1)"></iframe>\n\n'
    "![tracker](http://example.invalid/pixel.png)\n\n"
    '<a href="#" onclick="alert(1)">x</a>\n\n'
    '<a href="  javascript:alert(1)">spaced</a>\n\n'
    "<style>body { display: none; }</style>\n\n"
    '[hover me](https://example.invalid "title" onmouseover="alert(1)")\n\n'
    '[title event](https://example.invalid "\\" onmouseover=\\"alert(1)")\n\n'
    "<javascript:alert(1)>\n\n"
    "[ref link][evil]\n\n"
    "[evil]: javascript:alert(1)\n\n"
    '<details open ontoggle="alert(1)"><summary>details</summary></details>\n\n'
    "<input autofocus onfocus=alert(1)>\n\n"
    '<form action="javascript:alert(1)"><button>submit</button></form>\n\n'
    '<object data="javascript:alert(1)"></object>\n\n'
    '<embed src="javascript:alert(1)">\n\n'
    '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">\n\n'
    '<base href="javascript:alert(1)//">\n\n'
    '<link rel="stylesheet" href="http://example.invalid/evil.css">\n\n'
    '<div style="background:url(javascript:alert(1))">styled div</div>\n\n'
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>\n\n"
    '<noscript><p title="</noscript><img src=x onerror=alert(1)>">\n\n'
    "<textarea><script>alert(1)</script></textarea>\n\n"
    "Inline code stays text: `<script>alert(1)</script>`\n\n"
    "```html\n<script>alert('in a code block')</script>\n```\n\n"
    "End of the corpus."
)
