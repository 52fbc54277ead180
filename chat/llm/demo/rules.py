"""What the user typed → what the demo model does: the whole reply, planned up front.

What it answers is decided by the **last message** of the request.

After a tool result (role ``tool``) it writes a final answer that uses the result. A
denial (``chat.core.prompts.denied_text``) is acknowledged ("Understood — I did not write
the file because you denied it: <reason>."), quoting the reason verbatim; a result
starting with "Error" is reported plainly; an expired approval request
(``chat.core.prompts.EXPIRED_TEXT``) is said to have expired; a calculator result gives
"The result is <result>.". After the ``compact`` tool result that carries a compaction
summary, it carries on with the newest user message instead.

After a user message (a leading ``[User appended]`` is ignored), the first rule in this
table that matches wins (keywords are case-insensitive whole words):

| you type | the demo model |
| --- | --- |
| `calculate 12*7`, `calc 2^10`, `what is 12*7` | calls `calculator(expression)` |
| `time` | calls `current_time()` |
| `write file notes.md`, `write a file` | calls `write_file(path, content)`: a short markdown draft (asks for approval); add "then read it" to chain a `read_file`; `write file page.html` writes a small HTML page whose script tries to reach its parent page and cookies |
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
is not available. Special modes, chosen from the system prompt or the request:

* **sub-agent** (the system prompt holds ``chat.core.prompts.SUB_AGENT_PROMPT``): a
  two-sentence report starting "Sub-agent report:"; calls `calculator` first when the task
  holds an expression.
* **persona** (system prompt contains "Respond as the persona <Name>"): one to three
  sentences in that persona's voice about the user's last message.
* **a cast** (the system prompt lists one, ``chat.core.voices.CAST_HEADER``): one to three
  speakers as ``<Name>…</Name>`` segments ("panel", "two voices"...); in a classroom (the
  prompt names the current scene) the classroom mode of :mod:`chat.llm.demo.classroom`.
* **compaction** (the last user message starts with
  ``chat.core.compact.SUMMARY_INSTRUCTIONS``): a nine-section summary naming the first user
  messages of the JSON transcript and how many messages it held.
* **moderation** (the system prompt is ``chat.core.prompts.MODERATION_PROMPT``):
  ``FLAG: <reason>`` when the message holds a word of ``MODERATION_DEMO_WORDS``
  ("unsafe-demo"), ``OK`` otherwise.

**In Chinese** (``texts_zh``): when the chat's language is Chinese (its system prompt holds
``chat.core.prompts.CHINESE_LINE``) or the user's last message holds Chinese characters, the
default answer, tool calls and their results, denials, code, ``long``, ``markdown`` and
sub-agent reports are in Simplified Chinese; ``计算 12*7``, ``几点``, ``写文件``, ``代码`` and
``长回答`` work like their English keywords.

Pure and deterministic: the only "randomness" is a ``random.Random`` seeded from a hash of
the request.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from chat.core.channels import strip_agent_xml_tag
from chat.core.compact import COMPACT_TOOL_NAME, SUMMARY_INSTRUCTIONS
from chat.core.messages import ChatMessage, Role, ToolCall
from chat.core.prompts import (
    CHINESE_LINE,
    DENIED_REASON_LABEL,
    DENIED_TEXT,
    EXPIRED_TEXT,
    MODERATION_FLAG,
    MODERATION_OK,
    MODERATION_PROMPT,
    SUB_AGENT_PROMPT,
    TITLE_INSTRUCTIONS,
    TITLE_USER_LABEL,
    USER_APPENDED_PREFIX,
)
from chat.core.voices import cast_from_prompt
from chat.llm.demo import classroom, texts_zh
from chat.llm.demo.texts import (
    DEFAULT_DELEGATE_TASK,
    DEFAULT_FILE,
    DRAFT_MARKER,
    FAIL_MIDWAY_TEXT,
    FINAL_MARKER,
    FINDINGS,
    OPENERS,
    PERSONA_LINES,
    SUB_AGENT_PREFIX,
    SUGGESTIONS,
    XSS_CORPUS,
    code_answer,
    draft_document,
    long_answer,
    markdown_answer,
    quote,
)
from chat.llm.types import ChatRequest


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
    zh: bool = False  # answer in Simplified Chinese (see wants_chinese)


def request_digest(request: ChatRequest) -> str:
    """Stable hash of what decides the answer (not the model id, not the thinking flag)."""
    payload = {
        "system": request.system_prompt,
        "messages": [
            [m.role, m.content, m.tool_call_id, m.sender_name, _calls_as_lists(m.tool_calls)]
            for m in request.messages
        ],
        "tools": sorted(offered_tools(request)),
    }
    encoded = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()


def _calls_as_lists(calls: list[ToolCall] | None) -> list[list[str]] | None:
    return None if calls is None else [[c.id, c.name, c.arguments] for c in calls]


# --- planning: which reply for which request ------------------------------------------------


def plan_reply(request: ChatRequest) -> DemoReply:
    """Decide the whole reply from the request. Pure and deterministic."""
    digest = request_digest(request)
    turn = _Turn(
        request=request,
        rng=random.Random(int(digest[:16], 16)),
        offered=offered_tools(request),
        zh=wants_chinese(request),
    )
    last = request.messages[-1] if request.messages else None
    sub_agent = SUB_AGENT_PROMPT in request.system_prompt
    if last is not None and last.role == Role.TOOL:
        reply = _reply_to_tool_result(turn, last)
        if reply is not None:
            return _as_sub_agent_report(reply) if sub_agent else reply
        # After a compaction the context ends on the summary: carry on with the user's request.
    text = _last_user_text(request.messages)
    if MODERATION_PROMPT in request.system_prompt:
        return _moderation_reply(text)
    if text.startswith(SUMMARY_INSTRUCTIONS):
        return _summary_reply(text)
    if text.startswith(TITLE_INSTRUCTIONS):
        return _title_reply(text)
    if sub_agent:
        return _sub_agent_reply(turn, text)
    cast = cast_from_prompt(request.system_prompt)
    if cast and classroom.in_classroom(request.system_prompt):
        voiced = classroom.reply(request.system_prompt, text)
        if voiced is not None:
            return DemoReply(*voiced)
    if cast:
        return _cast_reply(turn, cast, text)
    persona = _persona_name(request.system_prompt)
    if persona:
        return _persona_reply(turn, persona, text)
    for rule in _USER_RULES:
        reply = rule(turn, text)
        if reply is not None:
            return reply
    return _default_reply(turn, text)


_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def wants_chinese(request: ChatRequest) -> bool:
    """Answer in Chinese: the chat's language is Chinese (its system prompt says so,
    ``chat.core.prompts.CHINESE_LINE``), or the user's last message is written in it."""
    if CHINESE_LINE in request.system_prompt:
        return True
    return _HAN.search(_last_user_text(request.messages)) is not None


# The moderation check's words: a message with one of them is flagged, any other is OK.
MODERATION_DEMO_WORDS = ("unsafe-demo", "flag-me-demo")


def _moderation_reply(text: str) -> DemoReply:
    lowered = text.lower()
    for word in MODERATION_DEMO_WORDS:
        if word in lowered:
            return DemoReply("", f"{MODERATION_FLAG} the demo check found “{word}”")
    return DemoReply("", MODERATION_OK)


def offered_tools(request: ChatRequest) -> dict[str, dict[str, Any]]:
    offered: dict[str, dict[str, Any]] = {}
    for spec in request.tools:
        function = spec.get("function", spec)  # accept both OpenAI and flat specs
        if isinstance(function, dict) and function.get("name"):
            offered[str(function["name"])] = function
    return offered


# Messages queued while the agent was busy arrive marked; the mark is not content.
_APPENDED_MARK = re.compile(rf"^{re.escape(USER_APPENDED_PREFIX.strip())}[ \t]*", re.M)


def _last_user_text(messages: list[ChatMessage]) -> str:
    for message in reversed(messages):
        if message.role == Role.USER:
            content = message.content
            if message.sender_name:
                content = strip_agent_xml_tag(message.sender_name, content)
            return _APPENDED_MARK.sub("", content).strip()
    return ""


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
    if turn.zh:
        purpose_zh = texts_zh.TOOL_PURPOSES.get(name, name).format(
            expression=arguments.get("expression", ""), path=arguments.get("path", "")
        )
        if spec is None:
            return DemoReply(
                reasoning=texts_zh.tool_reasoning(name, purpose_zh),
                text=texts_zh.tool_missing(name, purpose_zh),
            )
        return DemoReply(
            reasoning=texts_zh.tool_reasoning(name, purpose_zh),
            tool_call=PlannedToolCall(name, _fit_arguments(spec, arguments)),
        )
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
_CALC_KEYWORD_ZH = re.compile(r"(?:计算|算一下|算算)[\s:：]*(?P<rest>.*)", re.S)
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
    keyword = _CALC_KEYWORD.search(text) or _CALC_KEYWORD_ZH.search(text)
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
    if not _has_word("time", text) and not re.search(r"时间|几点", text):
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


def _rule_write_file(turn: _Turn, text: str) -> DemoReply | None:
    asked, name = _file_request("write", text)
    if not asked and re.search(r"写(?:一个|个|一份)?文件", text):
        asked = True
    if not asked:
        return None
    path = name or DEFAULT_FILE
    arguments = {"path": path, "content": draft_document(path, text)}
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
        asked=f"delegate “{quote(task)}”",
    )


def _rule_code(turn: _Turn, text: str) -> DemoReply | None:
    if not _has_word("code", text) and "代码" not in text:
        return None
    if turn.zh:
        return DemoReply(
            reasoning=f"用户想要代码：“{quote(text)}”。我给出一个简短的 Python 函数和运行它的命令。",
            text=texts_zh.code_answer(text),
        )
    return DemoReply(
        reasoning=(
            f"The user asked for code: “{quote(text)}”. I will show a short Python "
            "function and a shell command that runs it, with a sentence on each."
        ),
        text=code_answer(text),
    )


def _rule_long(turn: _Turn, text: str) -> DemoReply | None:
    if not _has_word("long", text) and not re.search(r"长回答|长一点|长文", text):
        return None
    if turn.zh:
        return DemoReply(
            reasoning="用户想要一个长回答。我会写几个小节和一个列表，留出时间观看流式输出和按停止。",
            text=texts_zh.long_answer(text),
        )
    return DemoReply(
        reasoning=(
            "The user asked for a long answer. I will write several sections and a list "
            "so that there is time to watch it stream and to press Stop."
        ),
        text=long_answer(text),
    )


def _rule_fail(turn: _Turn, text: str) -> DemoReply | None:
    if re.search(r"\bfail[\s-]+mid-?way\b", text, re.I):
        return DemoReply(
            reasoning="The user asked me to fail midway. I will stream some words, then fail.",
            text=FAIL_MIDWAY_TEXT,
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
    if turn.zh:
        return DemoReply(
            reasoning="用户想看 markdown。我会在一个回答里用标题、表格、列表、强调、引文和行内代码。",
            text=texts_zh.markdown_answer(text),
        )
    return DemoReply(
        reasoning=(
            "The user wants to see markdown. I will use headings, a table, lists, emphasis, "
            "a blockquote and inline code in one reply."
        ),
        text=markdown_answer(text),
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


def _default_reply(turn: _Turn, text: str) -> DemoReply:
    if turn.zh:
        tips_zh = texts_zh.tips(turn.rng.sample(texts_zh.SUGGESTIONS, 3))
        if not text:
            return DemoReply(
                reasoning="用户发送了空消息。我会问好并建议可以尝试的内容。",
                text=texts_zh.greeting(tips_zh),
            )
        opener = turn.rng.choice(texts_zh.OPENERS)
        return DemoReply(
            reasoning=texts_zh.default_reasoning(text),
            text=texts_zh.default_answer(opener, text, tips_zh),
        )
    suggestions = turn.rng.sample(SUGGESTIONS, 3)
    tips = f"Try {suggestions[0]}, {suggestions[1]} or {suggestions[2]} to see what Lyceum can do."
    if not text:
        return DemoReply(
            reasoning="The user sent an empty message. I will greet them and suggest things to try.",
            text=f"Hello! I am Lyceum's offline demo model. {tips}",
        )
    opener = turn.rng.choice(OPENERS)
    return DemoReply(
        reasoning=(
            f"The user wrote “{quote(text)}”. No demo keyword matched, so I will reply "
            "briefly and suggest a few things to try."
        ),
        text=(
            f"{opener} — you wrote “{quote(text)}”. I am Lyceum's offline demo model, so I "
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
    if name == COMPACT_TOOL_NAME:
        return None
    arguments = _parsed_arguments(call)
    content = result.content.strip()
    first_line = (content.splitlines() or [""])[0]
    # The denial sentence comes first; a file that merely contains "denied" is not a denial.
    if first_line.lower().startswith(DENIED_TEXT.lower()):
        return _denial_reply(name, content, turn.zh)
    if first_line.startswith(EXPIRED_TEXT) and turn.zh:
        action = texts_zh.DENIED_ACTIONS.get(name, f"运行 {name}")
        return DemoReply(
            reasoning=f"没有人回答 {name} 的审批请求。我会说明这一点。",
            text=texts_zh.expired(action),
        )
    if first_line.startswith(EXPIRED_TEXT):
        action = _DENIED_ACTIONS.get(name, f"run {name}")
        return DemoReply(
            reasoning=f"Nobody answered the approval request for {name}. I will say so.",
            text=f"The approval request expired, so I did not {action}. Ask again when ready.",
        )
    if _ERROR_RESULT.match(content):
        detail = _ERROR_PREFIX.sub("", first_line).strip() or "no details"
        ending = "" if detail[-1] in ".!?" else "."
        if turn.zh:
            return DemoReply(
                reasoning=f"{name} 工具报告了一个错误。我会直接告诉用户。",
                text=texts_zh.tool_error(name, detail + ending),
            )
        return DemoReply(
            reasoning=f"The {name} tool reported an error. I will tell the user plainly.",
            text=f"The `{name}` tool reported an error, so that step did not work: {detail}{ending}",
        )
    reasoning = f"The {name} tool returned a result. I will use it to answer the user."
    chained = _chained_read(turn, name, arguments)
    if chained is not None:
        return chained
    if turn.zh:
        path = str(arguments.get("path") or DEFAULT_FILE)
        text = texts_zh.result_text(
            name, path, content, _fenced(content[:2000]), _calculator_value(content)
        )
        return DemoReply(reasoning=f"{name} 工具返回了结果。我会用它来回答用户。", text=text)
    return DemoReply(reasoning=reasoning, text=_result_text(name, arguments, content))


def _denial_reply(tool_name: str, content: str, zh: bool = False) -> DemoReply:
    action = _DENIED_ACTIONS.get(tool_name, f"run {tool_name}")
    reason_match = re.search(
        rf"{re.escape(DENIED_REASON_LABEL)}\s*(?P<reason>.*)", content, re.I | re.S
    )
    reason = reason_match["reason"].strip() if reason_match else ""
    if zh:
        action = texts_zh.DENIED_ACTIONS.get(tool_name, f"运行 {tool_name}")
        return DemoReply(
            reasoning=f"用户拒绝了 {tool_name} 调用。我会确认这一点，不再尝试。",
            text=texts_zh.denied(action, reason.rstrip(".!?。！？")),
        )
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
    return f"The `{tool_name}` tool returned: {quote(content, 200)}"


# --- special modes: sub-agent, persona, compaction summary --------------------------------


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
    if turn.zh:
        return DemoReply(
            reasoning=f"我是处理“{quote(task)}”的子代理。我会向主代理简短汇报。",
            text=texts_zh.sub_agent_report(SUB_AGENT_PREFIX, task),
        )
    finding = turn.rng.choice(FINDINGS)
    return DemoReply(
        reasoning=(
            f"I am a sub-agent working on “{quote(task)}”. I will report briefly to the lead."
        ),
        text=(
            f"{SUB_AGENT_PREFIX} I looked into “{quote(task)}” and found that {finding}. "
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


def _persona_name(system_prompt: str) -> str | None:
    match = _PERSONA.search(system_prompt)
    if match is None:
        return None
    return (match["quoted"] or match["name"] or "").strip() or None


def _persona_reply(turn: _Turn, name: str, text: str) -> DemoReply:
    line = turn.rng.choice(PERSONA_LINES)
    return DemoReply(
        reasoning=(
            f"I am speaking as {name}. The student said “{quote(text)}”; "
            "I will answer in character in a sentence or two."
        ),
        text=line.format(name=name, quote=quote(text or "…")),
    )


# --- a cast: several speakers in one reply ---------------------------------------------------

_VOICE_COUNT = {"panel": 2, "two voices": 2, "both": 2, "three voices": 3, "everyone": 3}


def _voices_wanted(text: str) -> int:
    lowered = text.lower()
    return max((n for word, n in _VOICE_COUNT.items() if word in lowered), default=1)


def _cast_reply(turn: _Turn, cast: list[str], text: str) -> DemoReply:
    """Speak as the cast, each reply in its speaker's tag (chat.core.voices).

    "panel" or "two voices" brings two speakers, "three voices" or "everyone" three,
    anything else the first; "untagged" answers without tags (the fallback path).
    """
    if "untagged" in text.lower():
        return DemoReply(
            reasoning="The user asked for an answer without speaker tags.",
            text=f"No tags here: this whole answer goes to {cast[0]}. You wrote “{quote(text)}”.",
        )
    speakers = cast[: _voices_wanted(text)]
    lines = [
        f"<{name}>{PERSONA_LINES[index % len(PERSONA_LINES)].format(name=name, quote=quote(text or '…'))}</{name}>"
        for index, name in enumerate(speakers)
    ]
    return DemoReply(
        reasoning=f"I will answer as {', '.join(speakers)}, one tagged reply each.",
        text="\n".join(lines),
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
        primary = "; then ".join(f"“{quote(u, 160)}”" for u in users[:3])
        current = f"“{quote(users[-1], 160)}”"
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


def _title_reply(prompt: str) -> DemoReply:
    """A chat's title: the first six words of its first message, as written."""
    asked = ""
    for line in prompt.splitlines():
        if line.startswith(TITLE_USER_LABEL):
            asked = line[len(TITLE_USER_LABEL) :]
            break
    title = " ".join(asked.split()[:6]) or "A chat"
    return DemoReply(reasoning="", text=title)
