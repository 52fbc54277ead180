"""Branches of a chat's display log: which events are on the path shown, and versions.

The log stays append-only; a branch is a pointer. Two event kinds give the log its shape:

* ``{"type": "fork", "parent": B, "at": P, "ctx": S}`` starts a new branch (its id is the
  fork's own seq). Its path is the path of branch ``B`` before seq ``P``, then the events
  written while it is current. Editing a message forks at that message; regenerating a
  reply forks at the first event after the user message it answers.
* ``{"type": "switch", "to": B, "ctx": S}`` makes branch ``B`` current again.

Every other event belongs to the branch current when it was written (the root, ``0``,
until the first fork). ``ctx`` is the last seq of the context channel when the event was
written: the context of the branch being left, to restore when it is current again.

Because each event belongs to exactly one branch and a branch's path only ever takes a
prefix of its parent's, every event has one predecessor on every path that holds it: the
log is a tree. The *versions* at an event ``b`` (the *base*) are its children: the event
that first followed it, and each fork whose path leaves ``b``'s branch right after ``b``.

Pure Python: the store reads the structural events; everything here is plain functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FORK, SWITCH = "fork", "switch"
KINDS = (FORK, SWITCH)
ROOT = 0
ORIGINAL = -1  # the member of a group of versions that is no fork: what came first

Span = tuple[int, int | None]  # seqs lo <= seq < hi; hi None: open


@dataclass(frozen=True)
class Path:
    """The seqs of one branch's path, as sorted disjoint spans."""

    spans: tuple[Span, ...] = ((1, None),)

    def contains(self, seq: int) -> bool:
        return any(lo <= seq and (hi is None or seq < hi) for lo, hi in self.spans)

    def below(self, seq: int) -> Path:
        """The part of the path before ``seq``."""
        out: list[Span] = []
        for lo, hi in self.spans:
            if lo >= seq:
                break
            top = seq if hi is None else min(hi, seq)
            if top > lo:
                out.append((lo, top))
        return Path(tuple(out))

    def last_before(self, seq: int) -> int:
        """The newest seq of the path before ``seq`` (0: none)."""
        best = 0
        for lo, hi in self.spans:
            if lo >= seq:
                break
            best = seq - 1 if hi is None else min(hi, seq) - 1
        return best

    def join(self, spans: Iterable[Span]) -> Path:
        return Path(self.spans + tuple(s for s in spans if s[1] is None or s[1] > s[0]))

    @property
    def whole(self) -> bool:
        """The path is the whole log (a chat that never branched)."""
        return self.spans == ((1, None),)


@dataclass(frozen=True)
class Fork:
    id: int
    parent: int
    at: int
    ctx: int


@dataclass(frozen=True)
class Versions:
    """A group of versions on the active path: after event ``base`` (0: the chat's start)."""

    base: int
    index: int  # of the one on the active path, from 0
    count: int


@dataclass
class Structure:
    """The branches of one chat's log, folded from its fork and switch events."""

    forks: dict[int, Fork] = field(default_factory=dict)
    own: dict[int, list[Span]] = field(default_factory=lambda: {ROOT: []})
    active: int = ROOT
    became_current: dict[int, int] = field(default_factory=lambda: {ROOT: 0})
    left_ctx: dict[int, int] = field(default_factory=dict)  # context when last left
    last_seq: int = 0  # of the newest fork or switch (0: never branched)
    _paths: dict[int, Path] = field(default_factory=dict)
    _bases: dict[int, int] = field(default_factory=dict)

    @property
    def branched(self) -> bool:
        return bool(self.forks)

    def path(self, branch: int | None = None) -> Path:
        """The path of ``branch`` (the active one by default)."""
        branch = self.active if branch is None else branch
        if branch not in self._paths:
            own = self.own.get(branch, [])
            if branch == ROOT:
                self._paths[branch] = Path().below(1).join(own) if self.forks else Path()
            else:
                fork = self.forks[branch]
                self._paths[branch] = self.path(fork.parent).below(fork.at).join(own)
        return self._paths[branch]

    def base(self, fork_id: int) -> int:
        """The event after which a fork's path leaves its parent's (0: the chat's start)."""
        if fork_id not in self._bases:
            fork = self.forks[fork_id]
            self._bases[fork_id] = self.path(fork.parent).last_before(fork.at)
        return self._bases[fork_id]

    def owns(self, branch: int, seq: int) -> bool:
        return any(lo <= seq and (hi is None or seq < hi) for lo, hi in self.own.get(branch, []))

    def members(self, base: int) -> list[int]:
        """The versions after ``base``: :data:`ORIGINAL`, then its forks, oldest first."""
        return [ORIGINAL, *sorted(f for f in self.forks if self.base(f) == base)]

    def member_of(self, branch: int, base: int) -> int:
        """Which version after ``base`` the path of ``branch`` takes (``base`` on that path)."""
        current = branch
        while current != ROOT:
            if self.base(current) == base:
                return current
            if self.owns(current, base):
                return ORIGINAL
            current = self.forks[current].parent
        return ORIGINAL

    def on_path(self, branch: int, base: int) -> bool:
        return base == 0 or self.path(branch).contains(base)

    def versions(self) -> list[Versions]:
        """Every group of two or more versions on the active path, oldest base first."""
        bases = sorted({self.base(f) for f in self.forks})
        out = []
        for base in bases:
            if not self.on_path(self.active, base):
                continue
            members = self.members(base)
            index = members.index(self.member_of(self.active, base))
            out.append(Versions(base, index, len(members)))
        return out

    def switch_target(self, base: int, index: int) -> int | None:
        """The branch to make current to show version ``index`` after ``base``: of the
        branches through that version, the one current last (where the person left it).
        None when there is no such version."""
        members = self.members(base)
        if not 0 <= index < len(members) or not self.on_path(self.active, base):
            return None
        wanted = members[index]
        candidates = [
            b
            for b in [ROOT, *self.forks]
            if self.on_path(b, base) and self.member_of(b, base) == wanted
        ]
        if not candidates:
            return None
        return max(candidates, key=lambda b: self.became_current.get(b, -1))


def structure(events: Iterable[tuple[int, str, dict[str, Any]]]) -> Structure:
    """Fold a chat's fork and switch events (seq, kind, payload), in any order."""
    s = Structure()
    start = 1
    for seq, kind, payload in sorted(events, key=lambda e: e[0]):
        if kind not in KINDS:
            continue
        s.own.setdefault(s.active, []).append((start, seq))
        s.left_ctx[s.active] = int(payload.get("ctx") or 0)
        if kind == FORK:
            parent = int(payload.get("parent") or 0)
            s.forks[seq] = Fork(
                seq, parent, int(payload.get("at") or 0), int(payload.get("ctx") or 0)
            )
            s.own[seq] = []
            s.active = seq
        else:
            target = int(payload.get("to") or 0)
            s.active = target if target == ROOT or target in s.forks else s.active
        s.became_current[s.active] = seq
        start = seq + 1
        s.last_seq = seq
    s.own.setdefault(s.active, []).append((start, None))
    for branch, spans in s.own.items():
        s.own[branch] = [(lo, hi) for lo, hi in spans if hi is None or hi > lo]
    return s
