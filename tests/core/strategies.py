"""Hypothesis strategies for the message core, shared by the core tests and others.

``live_chats()`` draws a script of pushes as a live chat produces them: user
messages (some with images), assistant text, assistant tool-call groups of 1–3
calls followed by some or all of their results, sender-labelled messages at random
points (also while a group is open), and optionally stray orphan results and empty
tool-call ids. ``run_live_chat()`` plays a script into ``LiveChannels`` with the
persist loop of the app: after every push, ``msg`` events for
``context[persisted:safe_cut(context, persisted)]`` are appended and ``persisted``
advances. Events go through ``json.dumps``/``json.loads`` as they would in the DB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from chat.core.channels import LiveChannels, wrap_for_context
from chat.core.eventlog import msg_event, safe_cut
from chat.core.messages import ChatMessage, Image, Role, ToolCall

# Inner text never contains "<", so a wrapper in display can only come from a bug.
TEXT_ALPHABET = st.characters(
    blacklist_categories=("Cs",), blacklist_characters="<", min_codepoint=32, max_codepoint=0x2FFF
)
# A marker that must never reach a serialized event (images are never persisted).
IMAGE_MARKER = "SU1BR0UtTUFSS0VS"

texts = st.text(alphabet=TEXT_ALPHABET, max_size=16)
# Live chats draw many messages; a fixed pool of words keeps generation fast, and the
# structure (roles, calls, order) is what their properties are about.
chat_texts = st.sampled_from(["", "hi", "ok 42", " spaced ", "ünïcødé 你好", "a > b", "x/y"])
senders = st.sampled_from(["SubAgent@search_auth", "Teammate@Frontend", "Ms Rivera", "Bob"])
images = st.lists(
    st.builds(
        Image,
        base64=st.text(alphabet="abcdef0123", max_size=8).map(lambda s: IMAGE_MARKER + s),
        media_type=st.sampled_from(["image/png", "image/jpeg"]),
    ),
    min_size=1,
    max_size=2,
)
optional_reasoning = st.one_of(st.none(), texts.filter(bool))
chat_reasoning = st.one_of(st.none(), st.just("thinking…"))


# Strategies used inside the composites are built once here: building them per draw
# (validation included) costs more than the drawing itself.
tool_names = st.sampled_from(["read_file", "search", "Agent"])
tool_arguments = st.sampled_from(["{}", '{"path": "a.py"}', '{"q": "x"}'])
labelled_roles = st.sampled_from([Role.ASSISTANT, Role.ASSISTANT, Role.USER])
labelled_extras = st.sampled_from([(), (("run", "r1"),)]).map(dict)
request_texts = st.sampled_from(["", "Let me look."])
call_counts = st.integers(1, 3)
blank_id_draws = st.integers(0, 4)  # 0 means this call has no id (1 in 5)
answered_counts = {n: st.one_of(st.just(n), st.integers(0, n)) for n in (1, 2, 3)}
result_orders = {n: st.permutations(range(n)) for n in (1, 2, 3)}
optional_images = st.one_of(st.none(), images)


@st.composite
def tool_calls(draw: st.DrawFn, ids: list[str]) -> list[ToolCall]:
    """Tool calls with the given ids (names and arguments drawn)."""
    return [
        ToolCall(id=call_id, name=draw(tool_names), arguments=draw(tool_arguments))
        for call_id in ids
    ]


@st.composite
def labelled_messages(draw: st.DrawFn) -> ChatMessage:
    """A sub-agent / persona / teacher message, sometimes already tag-wrapped."""
    sender = draw(senders)
    inner = draw(chat_texts)
    content = wrap_for_context(sender, inner) if draw(st.booleans()) else inner
    return ChatMessage(
        role=draw(labelled_roles), content=content, sender_name=sender, extra=draw(labelled_extras)
    )


labelled_bursts = st.lists(labelled_messages(), max_size=2)


@dataclass(frozen=True)
class Push:
    """One write to the live channels: ``labelled`` uses push_labelled, else push_both."""

    message: ChatMessage
    labelled: bool = False


@dataclass(frozen=True)
class ToolGroup:
    """An assistant tool-call message and the results pushed for it (same objects)."""

    request: ChatMessage
    results: tuple[ChatMessage, ...]


@dataclass(frozen=True)
class LiveChatScript:
    pushes: tuple[Push, ...]
    groups: tuple[ToolGroup, ...]


STEP_KINDS = ("user", "user", "assistant", "labelled", "labelled", "group", "group", "empty_calls")


@st.composite
def live_chats(
    draw: st.DrawFn,
    *,
    orphans: bool = True,
    empty_ids: bool = True,
    all_results: bool = False,
    max_steps: int = 10,
) -> LiveChatScript:
    """A random sequence of pushes as a live chat would produce them.

    ``all_results`` gives every tool call its result (no run interrupted mid-group).
    """
    kinds = STEP_KINDS + (("orphan",) if orphans else ())
    pushes: list[Push] = []
    groups: list[ToolGroup] = []
    serial = 0

    def labelled_burst() -> None:
        for message in draw(labelled_bursts):
            pushes.append(Push(message, labelled=True))

    step_counts, step_kinds = st.integers(0, max_steps), st.sampled_from(kinds)
    for _ in range(draw(step_counts)):
        kind = draw(step_kinds)
        if kind == "user":
            shown = draw(optional_images)
            pushes.append(Push(ChatMessage(role=Role.USER, content=draw(chat_texts), images=shown)))
        elif kind == "assistant":
            message = ChatMessage(
                role=Role.ASSISTANT,
                content=draw(chat_texts),
                reasoning_content=draw(chat_reasoning),
            )
            pushes.append(Push(message))
        elif kind == "labelled":
            labelled_burst()
        elif kind == "empty_calls":
            pushes.append(
                Push(ChatMessage(role=Role.ASSISTANT, content=draw(chat_texts), tool_calls=[]))
            )
        elif kind == "orphan":
            serial += 1
            orphan = ChatMessage(
                role=Role.TOOL, content=draw(chat_texts), tool_call_id=f"orphan_{serial}"
            )
            pushes.append(Push(orphan))
        else:
            count = draw(call_counts)
            ids = []
            for _ in range(count):
                serial += 1
                blank = empty_ids and draw(blank_id_draws) == 0
                ids.append("" if blank else f"call_{serial}")
            request = ChatMessage(
                role=Role.ASSISTANT,
                content=draw(request_texts),
                tool_calls=draw(tool_calls(ids)),
                reasoning_content=draw(chat_reasoning),
            )
            pushes.append(Push(request))
            labelled_burst()
            answered = count if all_results else draw(answered_counts[count])
            order = draw(result_orders[count])[:answered]
            results = []
            for position in order:
                result = ChatMessage(
                    role=Role.TOOL, content=draw(chat_texts), tool_call_id=ids[position]
                )
                results.append(result)
                pushes.append(Push(result))
                labelled_burst()
            groups.append(ToolGroup(request, tuple(results)))
    return LiveChatScript(tuple(pushes), tuple(groups))


def as_stored(event: dict[str, Any]) -> dict[str, Any]:
    """An event as it comes back from the DB payload column."""
    return json.loads(json.dumps(event))


@dataclass
class LiveRun:
    """The state after playing a script: channels, both logs and the persisted count."""

    channels: LiveChannels = field(default_factory=LiveChannels)
    session_log: list[dict[str, Any]] = field(default_factory=list)
    display_log: list[dict[str, Any]] = field(default_factory=list)
    persisted: int = 0

    def persist(self) -> None:
        """The app's persist loop: context up to the safe cut, display in full."""
        context = self.channels.context
        cut = safe_cut(context, self.persisted)
        self.session_log.extend(as_stored(msg_event(m)) for m in context[self.persisted : cut])
        self.persisted = cut
        shown = self.channels.display
        self.display_log.extend(as_stored(msg_event(m)) for m in shown[len(self.display_log) :])


def run_live_chat(script: LiveChatScript) -> LiveRun:
    run = LiveRun()
    for push in script.pushes:
        if push.labelled:
            run.channels.push_labelled(push.message)
        else:
            run.channels.push_both(push.message)
        run.persist()
    return run
