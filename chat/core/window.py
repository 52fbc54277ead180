"""Window selection: which history messages the model sees this round.

``select_messages`` is the reference's 4-phase priority window:

1. the list is cut into atomic *units* (system, user, assistant text, tool group = a
   tool-calling assistant message plus the tool results right after it);
2. system units are always kept (and counted, even over budget);
3. stage 1, recency: the newest ``keep_recent × 2`` units, newest first, stopping at the
   first one that does not fit;
4. stage 2, exempt tools: tool groups that used a key / exempt tool, newest first,
   skipping those that do not fit;
5. stage 3, proportional quota: of what was left before this stage, users get 35 %,
   assistant text 25 %, tool groups 40 % (messages and tokens), newest first per tier;
6. stage 4, overflow: any unit, newest first, into whatever budget is left;
7. the newest user message is forced in if it was not kept;
8. reassembly in original order; runs of dropped tool groups become one assistant
   placeholder ``[Previous: used A, B]``, dropped user / assistant text just vanish.

Deliberate differences from the reference:

* token limits are in tokens (not thousands) and use :mod:`chat.core.tokens`;
* an orphan run of tool results is one unit, counted and emitted once;
* the fallback forces the newest user unit whenever it was not kept (the reference only
  did so when *no* user unit was kept, so a long tool run could push the current request
  out while an older, smaller user message stayed in);
* placeholders are not counted against the budget (as in the reference) — callers should
  expect at most one extra message per run of dropped groups.

Message objects are shared with the input, not copied (copying 10,000 dataclasses would
cost more than the whole selection); treat them as immutable.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import accumulate
from operator import attrgetter

from chat.core.messages import ChatMessage, Role
from chat.core.tokens import estimate_each

# Tools whose groups are protected by stage 2 and never micro-compacted. ``compact`` is the
# synthetic tool pair that carries a compaction summary (see chat.core.compact): dropping or
# shrinking it would lose the whole earlier conversation.
KEY_TOOLS: frozenset[str] = frozenset({"delegate", "compact"})

KEEP_RECENT_MULTIPLIER = 2
# Percentages (integers, so the floors are exact) of the budget left before stage 3.
QUOTA_USER_PERCENT = 35
QUOTA_ASSISTANT_TEXT_PERCENT = 25
QUOTA_TOOL_GROUP_PERCENT = 40

PLACEHOLDER_PREFIX = "[Previous: used "
NO_NAMES_PLACEHOLDER = "[Previous tool calls dropped]"

# Larger than any real budget; keeps the arithmetic in ints.
_UNLIMITED = 1 << 62

_USER, _ASSISTANT, _TOOL = Role.USER.value, Role.ASSISTANT.value, Role.TOOL.value
_call_name = attrgetter("name")


class UnitKind(IntEnum):
    """Values are the reference's context tiers (lower = more important)."""

    SYSTEM = 0
    USER = 1
    ASSISTANT_TEXT = 3
    TOOL_GROUP = 4


@dataclass(slots=True)
class Unit:
    """Messages ``[start, end)`` of the input that are kept or dropped together."""

    kind: UnitKind
    start: int
    end: int
    tokens: int
    tool_names: tuple[str, ...] = ()  # chronological; empty for orphan results
    orphan: bool = False  # tool results with no tool-calling assistant before them

    @property
    def message_count(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class WindowChoice:
    """Which units were retained, and the index of the user unit forced in (if any)."""

    retained: list[bool]
    forced_user: int | None = None


def is_exempt_tool(name: str, exempt_tools: Container[str] = frozenset()) -> bool:
    return name in KEY_TOOLS or name in exempt_tools


def is_placeholder(message: ChatMessage) -> bool:
    """True for the assistant message that stands for dropped tool groups."""
    return (
        message.role == _ASSISTANT
        and message.tool_calls is None
        and (
            message.content == NO_NAMES_PLACEHOLDER
            or (message.content.startswith(PLACEHOLDER_PREFIX) and message.content.endswith("]"))
        )
    )


def placeholder_message(tool_names: list[str]) -> ChatMessage:
    names = [name for name in tool_names if name]
    text = f"{PLACEHOLDER_PREFIX}{', '.join(names)}]" if names else NO_NAMES_PLACEHOLDER
    return ChatMessage(role=_ASSISTANT, content=text)


@dataclass(slots=True)
class _Layout:
    """The units of a message list as parallel lists: cheap to build and to scan."""

    kinds: list[UnitKind]
    starts: list[int]
    ends: list[int]
    tokens: list[int]
    names: list[tuple[str, ...]]
    orphans: list[bool]

    @classmethod
    def of_units(cls, all_units: list[Unit]) -> _Layout:
        return cls(
            [u.kind for u in all_units],
            [u.start for u in all_units],
            [u.end for u in all_units],
            [u.tokens for u in all_units],
            [u.tool_names for u in all_units],
            [u.orphan for u in all_units],
        )

    def to_units(self) -> list[Unit]:
        columns = (self.kinds, self.starts, self.ends, self.tokens, self.names, self.orphans)
        return [Unit(*row) for row in zip(*columns, strict=True)]


def _layout(messages: list[ChatMessage], message_tokens: list[int]) -> _Layout:
    prefix = [0, *accumulate(message_tokens)]  # unit tokens in O(1) per unit
    roles = [m.role for m in messages]
    # One row per unit, transposed into columns at the end.
    rows: list[tuple[UnitKind, int, int, int, tuple[str, ...], bool]] = []
    add = rows.append
    count = len(roles)
    index = 0
    while index < count:
        role = roles[index]
        end = index + 1
        names: tuple[str, ...] = ()
        if role == _USER:
            kind = UnitKind.USER
        elif role == _ASSISTANT and messages[index].tool_calls is None:
            kind = UnitKind.ASSISTANT_TEXT
        elif role in (_ASSISTANT, _TOOL):
            kind = UnitKind.TOOL_GROUP
            if role == _ASSISTANT:
                names = tuple(map(_call_name, messages[index].tool_calls or ()))
            while end < count and roles[end] == _TOOL:
                end += 1
        else:  # system and any unknown role
            kind = UnitKind.SYSTEM
        add((kind, index, end, prefix[end] - prefix[index], names, role == _TOOL))
        index = end
    if not rows:
        return _Layout([], [], [], [], [], [])
    kinds, starts, ends, tokens, names_column, orphans = map(list, zip(*rows, strict=True))
    return _Layout(kinds, starts, ends, tokens, names_column, orphans)


def units(messages: list[ChatMessage], message_tokens: list[int] | None = None) -> list[Unit]:
    """Cut ``messages`` into units; ``message_tokens`` (per message) is estimated if omitted."""
    if message_tokens is None:
        message_tokens = estimate_each(messages)
    return _layout(messages, message_tokens).to_units()


class _Budget:
    """Global message / token bookkeeping shared by every stage."""

    __slots__ = (
        "counts",
        "tokens",
        "retained",
        "max_messages",
        "max_tokens",
        "used_messages",
        "used_tokens",
    )

    def __init__(self, layout: _Layout, max_messages: int, max_tokens: int) -> None:
        self.counts = [end - start for start, end in zip(layout.starts, layout.ends, strict=True)]
        self.tokens = layout.tokens
        self.retained = [False] * len(layout.kinds)
        self.max_messages = max_messages
        self.max_tokens = max_tokens
        self.used_messages = 0
        self.used_tokens = 0

    def force(self, index: int) -> None:
        self.retained[index] = True
        self.used_messages += self.counts[index]
        self.used_tokens += self.tokens[index]

    def try_retain(self, index: int) -> bool:
        if (
            self.retained[index]
            or self.used_messages + self.counts[index] > self.max_messages
            or self.used_tokens + self.tokens[index] > self.max_tokens
        ):
            return False
        self.force(index)
        return True


def choose_units(
    all_units: list[Unit],
    *,
    max_messages: int = 0,
    max_tokens: int = 0,
    keep_recent: int = 10,
    exempt_tools: Iterable[str] = frozenset(),
) -> WindowChoice:
    """Run the four stages and the newest-user fallback over already-built units."""
    return _choose(_Layout.of_units(all_units), max_messages, max_tokens, keep_recent, exempt_tools)


def _choose(
    layout: _Layout,
    max_messages: int,
    max_tokens: int,
    keep_recent: int,
    exempt_tools: Iterable[str],
) -> WindowChoice:
    budget = _Budget(
        layout,
        max_messages if max_messages > 0 else _UNLIMITED,
        max_tokens if max_tokens > 0 else _UNLIMITED,
    )
    by_kind: dict[UnitKind, list[int]] = {kind: [] for kind in UnitKind}
    for index, kind in enumerate(layout.kinds):
        by_kind[kind].append(index)

    for index in by_kind[UnitKind.SYSTEM]:
        budget.force(index)
    _stage_recency(budget, layout.kinds, keep_recent * KEEP_RECENT_MULTIPLIER)
    exempt = KEY_TOOLS | frozenset(exempt_tools)
    _stage_exempt(budget, by_kind[UnitKind.TOOL_GROUP], layout.names, exempt)
    _stage_quota(budget, by_kind)
    _stage_overflow(budget)

    forced_user = None
    users = by_kind[UnitKind.USER]
    if users and not budget.retained[users[-1]]:
        forced_user = users[-1]
        budget.force(forced_user)
    return WindowChoice(budget.retained, forced_user)


def _stage_recency(budget: _Budget, kinds: list[UnitKind], max_units: int) -> None:
    taken = 0
    for index in range(len(kinds) - 1, -1, -1):
        if taken >= max_units:
            return
        if kinds[index] == UnitKind.SYSTEM:
            continue
        if not budget.try_retain(index):
            return  # the guarantee is a contiguous recent block: stop at the first misfit
        taken += 1


def _stage_exempt(
    budget: _Budget, tool_groups: list[int], names: list[tuple[str, ...]], exempt: frozenset[str]
) -> None:
    for index in reversed(tool_groups):
        if not budget.retained[index] and not exempt.isdisjoint(names[index]):
            budget.try_retain(index)


def _stage_quota(budget: _Budget, by_kind: dict[UnitKind, list[int]]) -> None:
    # Tier budgets come from what remained before this stage, not from what each tier leaves.
    remaining_messages = max(0, budget.max_messages - budget.used_messages)
    remaining_tokens = max(0, budget.max_tokens - budget.used_tokens)
    tiers = (
        (UnitKind.USER, QUOTA_USER_PERCENT),
        (UnitKind.ASSISTANT_TEXT, QUOTA_ASSISTANT_TEXT_PERCENT),
        (UnitKind.TOOL_GROUP, QUOTA_TOOL_GROUP_PERCENT),
    )
    counts, tokens, retained = budget.counts, budget.tokens, budget.retained
    for kind, percent in tiers:
        tier_messages = remaining_messages * percent // 100
        tier_tokens = remaining_tokens * percent // 100
        used_messages = used_tokens = 0
        for index in reversed(by_kind[kind]):
            if (
                retained[index]
                or used_messages + counts[index] > tier_messages
                or used_tokens + tokens[index] > tier_tokens
            ):
                continue  # an older, smaller unit of this tier may still fit
            if budget.try_retain(index):
                used_messages += counts[index]
                used_tokens += tokens[index]


def _stage_overflow(budget: _Budget) -> None:
    counts, tokens, retained = budget.counts, budget.tokens, budget.retained
    for index in range(len(retained) - 1, -1, -1):
        free_messages = budget.max_messages - budget.used_messages
        if free_messages <= 0:
            return  # every unit has at least one message: nothing else can fit
        # Cheap local check first; most units are already kept or too big by now.
        if (
            not retained[index]
            and counts[index] <= free_messages
            and tokens[index] <= budget.max_tokens - budget.used_tokens
        ):
            budget.force(index)


def assemble(
    messages: list[ChatMessage], all_units: list[Unit], retained: list[bool]
) -> list[ChatMessage]:
    """Kept units in original order; each run of dropped tool groups becomes one placeholder."""
    return _assemble(messages, _Layout.of_units(all_units), retained)


def _assemble(
    messages: list[ChatMessage], layout: _Layout, retained: list[bool]
) -> list[ChatMessage]:
    result: list[ChatMessage] = []
    dropped_names: list[str] = []
    dropped_group = False
    rows = zip(layout.kinds, layout.starts, layout.ends, layout.names, retained, strict=True)
    for kind, start, end, names, keep in rows:
        if keep:
            if dropped_group:
                result.append(placeholder_message(dropped_names))
                dropped_names, dropped_group = [], False
            result.extend(messages[start:end])
        elif kind == UnitKind.TOOL_GROUP:
            dropped_group = True
            dropped_names.extend(names)
    if dropped_group:
        result.append(placeholder_message(dropped_names))
    return result


def select_messages(
    messages: list[ChatMessage],
    *,
    max_messages: int = 0,
    max_tokens: int = 0,
    keep_recent: int = 10,
    exempt_tools: frozenset[str] | set[str] = frozenset(),
) -> list[ChatMessage]:
    """The history the model sees; 0 means unlimited for either limit (tokens, not thousands)."""
    message_limit = max_messages if max_messages > 0 else _UNLIMITED
    if max_tokens > 0:
        message_tokens = estimate_each(messages)
        total_tokens = sum(message_tokens)
    else:
        # No token limit: estimates could never change the outcome, so skip them.
        message_tokens = [0] * len(messages)
        total_tokens = 0
    if len(messages) <= message_limit and (max_tokens <= 0 or total_tokens <= max_tokens):
        return list(messages)

    layout = _layout(messages, message_tokens)
    choice = _choose(layout, max_messages, max_tokens, keep_recent, exempt_tools)
    return _assemble(messages, layout, choice.retained)


def limits_for_context_window(
    context_window_tokens: int,
    reserve_for_output: int,
    *,
    reserve_for_prompt: int = 0,
    safety_percent: int = 10,
) -> int:
    """History token budget for a model: window − output − prompt/tools, minus a margin.

    The margin absorbs the heuristic's error. 0 (unknown window) means unlimited; a window
    too small for the reserves yields 1, so only the forced units are kept.
    """
    if context_window_tokens <= 0:
        return 0
    available = context_window_tokens - max(0, reserve_for_output) - max(0, reserve_for_prompt)
    return max(1, available * (100 - safety_percent) // 100)


@dataclass(frozen=True)
class WindowLimits:
    """The selection settings for one agent, so the loop passes one object around."""

    max_messages: int = 0
    max_tokens: int = 0
    keep_recent: int = 10
    exempt_tools: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def for_context_window(
        cls,
        context_window_tokens: int,
        reserve_for_output: int,
        *,
        reserve_for_prompt: int = 0,
        max_messages: int = 0,
        keep_recent: int = 10,
        exempt_tools: Iterable[str] = (),
    ) -> WindowLimits:
        return cls(
            max_messages=max_messages,
            max_tokens=limits_for_context_window(
                context_window_tokens, reserve_for_output, reserve_for_prompt=reserve_for_prompt
            ),
            keep_recent=keep_recent,
            exempt_tools=frozenset(exempt_tools),
        )

    def select(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        return select_messages(
            messages,
            max_messages=self.max_messages,
            max_tokens=self.max_tokens,
            keep_recent=self.keep_recent,
            exempt_tools=self.exempt_tools,
        )
