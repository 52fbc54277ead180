"""Branches as pointers in an append-only log: property tests over random chats.

A script of sends, edits, regenerations and version switches is played twice: into an
append-only log of events, the way the app writes it (a ``fork`` or ``switch`` event,
then the new messages; the context channel reset by a ``restore``), and into a plain
message tree that remembers the chosen child of every message (what a person expects).
The active path, the versions of every message on it and the context the model would
get must agree, and the core's invariants must hold on every path of the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.core import branches
from chat.core.eventlog import load, msg_event, replay, restore_event, safe_cut
from chat.core.messages import ChatMessage, Role, ToolCall

# --- the reference: a message tree ---------------------------------------------------------


@dataclass
class Node:
    label: str
    role: str
    parent: Node | None
    children: list[Node] = field(default_factory=list)
    chosen: int = 0  # the child on the path


class Tree:
    def __init__(self) -> None:
        self.root = Node("root", "", None)

    def path(self) -> list[Node]:
        out, node = [], self.root
        while node.children:
            node = node.children[node.chosen]
            out.append(node)
        return out

    def add(self, parent: Node, label: str, role: str) -> Node:
        node = Node(label, role, parent)
        parent.children.append(node)
        parent.chosen = len(parent.children) - 1
        return node

    def leaf(self) -> Node:
        path = self.path()
        return path[-1] if path else self.root


# --- the log, as the app writes it -------------------------------------------------------------


@dataclass
class Log:
    display: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    session: list[dict[str, Any]] = field(default_factory=list)

    def append(self, kind: str, **payload: Any) -> int:
        seq = len(self.display) + 1
        self.display.append((seq, kind, {"type": kind, **payload}))
        return seq

    def shape(self) -> branches.Structure:
        return branches.structure(e for e in self.display if e[1] in branches.KINDS)

    def path_events(self, s: branches.Structure, branch: int | None = None):
        path = s.path(branch)
        return [e for e in self.display if e[1] not in branches.KINDS and path.contains(e[0])]

    def context(self) -> list[ChatMessage]:
        return load(self.session).messages

    def session_until(self, seq: int) -> list[dict[str, Any]]:
        return self.session[:seq]


def labels_of(events) -> list[str]:
    return [p["content"] for _seq, kind, p in events if kind == "msg"]


class Chat:
    """Plays each step into the log and into the tree."""

    def __init__(self) -> None:
        self.log = Log()
        self.tree = Tree()
        self.count = 0

    def _label(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _persist(self, *messages: ChatMessage) -> None:
        # Context is written at safe cuts only: the whole group at once here.
        assert safe_cut(list(messages)) == len(messages)
        self.log.session += [msg_event(m) for m in messages]

    def _answer(self, user_node: Node, with_tool: bool) -> None:
        """A run: its events, a tool round (sometimes), the reply."""
        log = self.log
        log.append("run_start")
        reply = self._label("a")
        if with_tool:
            call = ToolCall(reply + "-call", "search", "{}")
            request = ChatMessage(Role.ASSISTANT, "", tool_calls=[call])
            result = ChatMessage(Role.TOOL, "found", tool_call_id=call.id)
            log.append("msg", **request.to_dict())
            log.append("tool_start", call_id=call.id)
            log.append("msg", **result.to_dict())
            self._persist(request, result)
            user_node = self.tree.add(self.tree.add(user_node, "", "call"), "found", "result")
        message = ChatMessage(Role.ASSISTANT, reply)
        log.append("msg", **message.to_dict())
        log.append("complete")
        self._persist(message)
        self.tree.add(user_node, reply, Role.ASSISTANT)

    def _user(self, parent: Node, with_tool: bool) -> None:
        label = self._label("u")
        seq = self.log.append("msg", role=Role.USER, content=label)
        # The run takes the message into context, marked with its display seq.
        self._persist(ChatMessage(Role.USER, label, extra={"input_seq": seq}))
        self._answer(self.tree.add(parent, label, Role.USER), with_tool)

    def send(self, with_tool: bool) -> None:
        self._user(self.tree.leaf(), with_tool)

    def _fork(self, at: int, context: list[ChatMessage]) -> None:
        s = self.log.shape()
        self.log.append("fork", parent=s.active, at=at, ctx=len(self.log.session))
        self.log.session.append(restore_event(context))

    def _marker(self, seq: int) -> int:
        """The context event of the user message shown at ``seq`` (1-based)."""
        for index, event in enumerate(self.log.session, start=1):
            if (event.get("extra") or {}).get("input_seq") == seq:
                return index
        raise AssertionError(f"no context for {seq}")

    def edit(self, pick: int, with_tool: bool) -> None:
        s = self.log.shape()
        users = [e for e in self.log.path_events(s) if e[2].get("role") == Role.USER]
        seq = users[pick % len(users)][0]
        before = load(self.log.session_until(self._marker(seq) - 1)).messages
        self._fork(seq, before)
        node = [n for n in self.tree.path() if n.label == users[pick % len(users)][2]["content"]]
        assert node[0].parent is not None
        self._user(node[0].parent, with_tool)

    def regenerate(self, pick: int, with_tool: bool) -> None:
        s = self.log.shape()
        events = self.log.path_events(s)
        users = [i for i, e in enumerate(events) if e[2].get("role") == Role.USER]
        index = users[pick % len(users)]
        seq, label = events[index][0], events[index][2]["content"]
        upto = load(self.log.session_until(self._marker(seq))).messages
        self._fork(events[index + 1][0], upto)
        node = [n for n in self.tree.path() if n.label == label][0]
        self._answer(node, with_tool)

    def switch(self, pick: int, step: int) -> bool:
        s = self.log.shape()
        groups = s.versions()
        if not groups:
            return False
        group = groups[pick % len(groups)]
        index = (group.index + step) % group.count
        target = s.switch_target(group.base, index)
        assert target is not None
        if target == s.active:
            return False
        self.log.append("switch", to=target, ctx=len(self.log.session))
        self.log.session.append(
            restore_event(load(self.log.session_until(s.left_ctx[target])).messages)
        )
        # The tree: the same group is the children of the node before the first message
        # after the base.
        node = self._node_after(s, group.base)
        assert node.parent is not None
        node.parent.chosen = index
        return True

    def _node_after(self, s: branches.Structure, base: int) -> Node:
        first = next(e for e in self.log.path_events(s) if e[0] > base and e[1] == "msg")
        kinds = [e for e in self.log.path_events(s) if e[1] == "msg" and e[0] < first[0]]
        return self.tree.path()[len(kinds)]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.booleans(), st.just(0)),
        st.tuples(st.just("edit"), st.booleans(), st.integers(0, 20)),
        st.tuples(st.just("regenerate"), st.booleans(), st.integers(0, 20)),
        st.tuples(st.just("switch"), st.integers(0, 20), st.sampled_from([-1, 1, 2])),
    ),
    min_size=1,
    max_size=25,
)


def play(script) -> Chat:
    chat = Chat()
    chat.send(False)
    for name, a, b in script:
        if name == "send":
            chat.send(a)
        elif name == "edit":
            chat.edit(b, a)
        elif name == "regenerate":
            chat.regenerate(b, a)
        else:
            chat.switch(a, b)
        check(chat)
    return chat


def tree_messages(path: list[Node]) -> list[str]:
    return [n.label for n in path]


def check(chat: Chat) -> None:
    s = chat.log.shape()
    events = chat.log.path_events(s)
    path = chat.tree.path()
    # The active path shows what the tree's chosen children give.
    assert [p.get("content") for _s, k, p in events if k == "msg"] == tree_messages(path)
    # The versions of every message: one group per node with siblings, same index.
    expected = [
        (n.label, n.parent.chosen, len(n.parent.children))
        for n in path
        if n.parent is not None and len(n.parent.children) > 1
    ]
    msgs = [e for e in events if e[1] == "msg"]
    got = []
    for group in s.versions():
        first = next(i for i, e in enumerate(msgs) if e[0] > group.base)
        got.append((path[first].label, group.index, group.count))
    assert got == expected
    # The context the model gets is the active path's, with nothing dangling.
    context = chat.log.context()
    assert [m.content for m in context] == [n.label for n in path]
    assert safe_cut(context) == len(context)
    assert not load([msg_event(m) for m in context]).repaired
    # Every path of the log keeps the invariants: no call without its results.
    for branch in [branches.ROOT, *s.forks]:
        shown = replay(p for _seq, kind, p in chat.log.path_events(s, branch) if kind == "msg")
        assert safe_cut(shown) == len(shown)
        assert not load([msg_event(m) for m in shown]).repaired


@settings(max_examples=300, deadline=None)
@given(steps)
def test_random_edits_regenerations_and_switches_agree_with_a_message_tree(script) -> None:
    play(script)


@settings(max_examples=100, deadline=None)
@given(steps)
def test_the_log_only_grows(script) -> None:
    chat = Chat()
    chat.send(False)
    for name, a, b in script:
        before = list(chat.log.display), list(chat.log.session)
        if name == "send":
            chat.send(a)
        elif name == "edit":
            chat.edit(b, a)
        elif name == "regenerate":
            chat.regenerate(b, a)
        else:
            chat.switch(a, b)
        assert chat.log.display[: len(before[0])] == before[0]
        assert chat.log.session[: len(before[1])] == before[1]


def test_an_unbranched_chat_is_the_whole_log() -> None:
    s = branches.structure([])
    assert s.path().whole and not s.branched and s.versions() == []
    assert s.path().contains(10**9)


def test_editing_the_first_message_gives_two_versions_of_it() -> None:
    chat = Chat()
    chat.send(False)
    chat.edit(0, False)
    s = chat.log.shape()
    assert s.versions() == [branches.Versions(base=0, index=1, count=2)]
    assert labels_of(chat.log.path_events(s)) == ["u3", "a4"]
    target = s.switch_target(0, 0)
    assert target == branches.ROOT
    chat.switch(0, 1)
    s = chat.log.shape()
    assert labels_of(chat.log.path_events(s)) == ["u1", "a2"]
    assert [m.content for m in chat.log.context()] == ["u1", "a2"]


def test_a_switch_back_returns_to_where_the_person_left_that_version() -> None:
    chat = Chat()
    chat.send(False)  # u1 a2
    chat.regenerate(0, False)  # a3 (version 2 of the reply)
    chat.send(False)  # u4 a5 on version 2
    s = chat.log.shape()
    assert [(v.index, v.count) for v in s.versions()] == [(1, 2)]
    chat.switch(0, 1)  # back to a2
    assert labels_of(chat.log.path_events(chat.log.shape())) == ["u1", "a2"]
    chat.switch(0, 1)  # version 2 again: with what followed it
    assert labels_of(chat.log.path_events(chat.log.shape())) == ["u1", "a3", "u4", "a5"]
