"""The event store: the only code that writes or reads ``ChatEvent`` rows.

Context (the ``session`` channel) is written only at safe cuts; display events
get the next gap-free ``seq`` under a row lock on the chat, so concurrent
writers (a run, a teacher stepping in, a second tab) never collide or skip.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone, translation

from chat.core import branches, eventlog
from chat.core.messages import ChatMessage
from chat.models import ChatEvent, ChatSession

SESSION = ChatEvent.Channel.SESSION
DISPLAY = ChatEvent.Channel.DISPLAY
_SEQ_FIELD = {SESSION: "last_session_seq", DISPLAY: "last_display_seq"}


def now_ms() -> int:
    return int(time.time() * 1000)


def append_events(chat_id, channel: str, payloads: Iterable[dict[str, Any]]) -> list[ChatEvent]:
    """Append events to one channel with consecutive seqs, atomically."""
    return append_to_channels(chat_id, {channel: list(payloads)})[channel]


def append_to_channels(
    chat_id, payloads: dict[str, list[dict[str, Any]]]
) -> dict[str, list[ChatEvent]]:
    """Append events to each channel given (consecutive seqs per channel), atomically:
    one counter update for all the channels and one insert for all the rows, so a run's
    reply and its context cost two statements, not four."""
    wanted = {channel: rows for channel, rows in payloads.items() if rows}
    written: dict[str, list[ChatEvent]] = {channel: [] for channel in payloads}
    if not wanted:
        return written
    # No savepoint inside a caller's transaction: a failure here fails the whole of it.
    with transaction.atomic(savepoint=False):
        lasts = _reserve_seqs(
            chat_id, {_SEQ_FIELD[channel]: len(rows) for channel, rows in wanted.items()}
        )
        for channel, rows in wanted.items():
            last = lasts[_SEQ_FIELD[channel]]
            written[channel] = [
                ChatEvent(chat_id=chat_id, channel=channel, seq=last + i, kind=p["type"], payload=p)
                for i, p in enumerate(rows, start=1)
            ]
        _insert([row for rows in written.values() for row in rows])
    return written


_INSERTED = ("chat", "channel", "seq", "kind", "payload", "created_at")


def _insert(events: list[ChatEvent]) -> None:
    """``bulk_create`` of new events, in one written-out ``INSERT … RETURNING``: every
    send and every commit of a run writes events on the process's one database thread,
    where the ORM's building of the insert cost more than running it (chat/rows.py).
    As ``bulk_create``, it sets each event's ``created_at``, id and saved state."""
    for start in range(0, len(events), _INSERT_BATCH):
        _insert_batch(events[start : start + _INSERT_BATCH])


_INSERT_BATCH = 100  # rows a statement: 600 parameters, within SQLite's oldest limit (999)


def _insert_batch(events: list[ChatEvent]) -> None:
    created = timezone.now()
    fields = [ChatEvent._meta.get_field(name) for name in _INSERTED]
    row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params: list[Any] = []
    for event in events:
        event.created_at = created
        params += [
            field.get_db_prep_save(getattr(event, field.attname), connection) for field in fields
        ]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(ChatEvent._meta.db_table)} "
        f"({', '.join(quote(str(field.column)) for field in fields)}) "
        f"VALUES {', '.join([row_sql] * len(events))} "
        f"RETURNING {quote(str(ChatEvent._meta.pk.column))}"  # type: ignore[union-attr]
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [pk for (pk,) in cursor.fetchall()]
    alias = connection.alias
    for event, pk in zip(events, ids, strict=True):
        event.pk = pk
        event._state.adding = False
        event._state.db = alias


def _reserve_seqs(chat_id, counts: dict[str, int], *, title: str | None = None) -> dict[str, int]:
    """Move the chat's counters on (field -> count), holding its row lock; each the seq
    before.

    One statement (UPDATE … RETURNING, PostgreSQL and SQLite alike) where reading the
    counters under the lock and writing them back took two: a run writes its events
    several times a reply, all through the process's one database thread.
    """
    opts = ChatSession._meta
    quote = connection.ops.quote_name
    fields = list(counts)
    columns = [quote(opts.get_field(field).column) for field in fields]
    updated = opts.get_field("updated_at")
    moves = ", ".join(f"{column} = {column} + %s" for column in columns)
    titling = ""
    if title is not None:
        titling = f"{quote(opts.get_field('title').column)} = %s, "
    sql = (
        f"UPDATE {quote(opts.db_table)} SET {moves}, {titling}"
        f"{quote(updated.column)} = %s WHERE {quote(opts.pk.column)} = %s "
        f"RETURNING {', '.join(columns)}"
    )
    params = [
        *(counts[field] for field in fields),
        *(
            [opts.get_field("title").get_db_prep_value(title, connection)]
            if title is not None
            else []
        ),
        updated.get_db_prep_value(timezone.now(), connection),
        opts.pk.get_db_prep_value(chat_id, connection),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist(f"no chat {chat_id}")
    return {field: value - counts[field] for field, value in zip(fields, row, strict=True)}


def reserve_seqs(chat_id, channel: str, count: int, *, title: str | None = None) -> int:
    """Reserve ``count`` seqs of ``channel`` (inside a transaction); the seq before them.
    The caller writes them with :func:`insert_events` in the same transaction.

    ``title``: set the chat's title in the same statement (a chat's first message).
    """
    return _reserve_seqs(chat_id, {_SEQ_FIELD[channel]: count}, title=title)[_SEQ_FIELD[channel]]


def insert_events(
    chat_id, channel: str, last: int, payloads: list[dict[str, Any]]
) -> list[ChatEvent]:
    """Write events at the seqs after ``last`` reserved by :func:`reserve_seqs`."""
    rows = [
        ChatEvent(chat_id=chat_id, channel=channel, seq=last + i, kind=p["type"], payload=p)
        for i, p in enumerate(payloads, start=1)
    ]
    _insert(rows)
    return rows


def append_display(chat_id, payloads: Iterable[dict[str, Any]]) -> list[ChatEvent]:
    return append_events(chat_id, DISPLAY, payloads)


def append_display_messages(chat_id, messages: Iterable[ChatMessage]) -> list[ChatEvent]:
    stamp = now_ms()
    return append_display(chat_id, [eventlog.msg_event(m, stamp) for m in messages])


def persist_context(chat_id, context: list[ChatMessage], persisted: int) -> int:
    """Write ``context[persisted:cut]`` where ``cut`` is the safe cut; returns the new count."""
    cut, payloads = context_due(context, persisted)
    append_events(chat_id, SESSION, payloads)
    return cut


def context_due(context: list[ChatMessage], persisted: int) -> tuple[int, list[dict[str, Any]]]:
    """The safe cut of ``context`` and the session events that write it from ``persisted``
    (for :func:`append_to_channels` with other events; :func:`persist_context` alone)."""
    cut = eventlog.safe_cut(context, persisted)
    if cut <= persisted:
        return cut, []
    stamp = now_ms()
    return cut, [eventlog.msg_event(m, stamp) for m in context[persisted:cut]]


def restore_context(chat_id, messages: list[ChatMessage]) -> None:
    """Replace context from here on (compaction, repair); earlier events stay in the log."""
    append_events(chat_id, SESSION, [eventlog.restore_event(messages)])


def _events_from_last_reset(chat_id, channel: str) -> list[dict[str, Any]]:
    """Events from the newest ``clear``/``restore`` on: replay never needs anything older.

    One fixed statement, written out (the newest reset in a subquery): every run start
    reads its context on the process's one database thread, where building the same
    query with the ORM cost more than running it.
    """
    opts = ChatEvent._meta
    quote = connection.ops.quote_name
    column = {name: quote(opts.get_field(name).column) for name in ("chat", "channel", "seq")}
    kind, payload = quote(opts.get_field("kind").column), opts.get_field("payload")
    table = quote(opts.db_table)
    where = f"{column['chat']} = %s AND {column['channel']} = %s"
    sql = (
        f"SELECT {quote(payload.column)} FROM {table} WHERE {where} AND {column['seq']} >= "
        f"COALESCE((SELECT {column['seq']} FROM {table} WHERE {where} AND {kind} IN (%s, %s) "
        f"ORDER BY {column['seq']} DESC LIMIT 1), 0) ORDER BY {column['seq']}"
    )
    chat = opts.get_field("chat").get_db_prep_value(chat_id, connection)
    params = [chat, channel, chat, channel, eventlog.CLEAR, eventlog.RESTORE]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [payload.from_db_value(value, None, connection) for (value,) in rows]


def load_context(chat_id) -> list[ChatMessage]:
    """Replay the session channel, repairing orphans (and recording the repair)."""
    loaded = eventlog.load(_events_from_last_reset(chat_id, SESSION))
    repair = loaded.repair_event()
    if repair is not None:
        append_events(chat_id, SESSION, [repair])
    return loaded.messages


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    kind: str
    payload: dict[str, Any]


def count_display_events_from(chat_id, seq: int) -> int:
    rows = ChatEvent.objects.filter(chat_id=chat_id, channel=DISPLAY, seq__gte=seq)
    return rows.filter(on_path(branch_shape(chat_id).path())).count()


def display_events_after(
    chat_id, after_seq: int, limit: int | None = None, *, shape: branches.Structure | None = None
) -> list[StoredEvent]:
    """Display events after ``after_seq`` on the active path (see :func:`branch_shape`)."""
    shape = branch_shape(chat_id) if shape is None else shape
    rows = ChatEvent.objects.filter(chat_id=chat_id, channel=DISPLAY, seq__gt=after_seq)
    if after_seq < shape.last_seq:  # everything after the last fork or switch is on the path
        rows = rows.filter(on_path(shape.path()))
    rows = rows.order_by("seq")
    if limit is not None:
        rows = rows[:limit]
    return [
        StoredEvent(seq, kind, payload)
        for seq, kind, payload in rows.values_list("seq", "kind", "payload")
    ]


def display_events_before(
    chat_id, before_seq: int | None, limit: int, *, shape: branches.Structure | None = None
) -> list[StoredEvent]:
    """The ``limit`` display events of the active path just before ``before_seq`` (the
    newest when None), oldest first."""
    shape = branch_shape(chat_id) if shape is None else shape
    rows = ChatEvent.objects.filter(chat_id=chat_id, channel=DISPLAY).filter(on_path(shape.path()))
    if before_seq is not None:
        rows = rows.filter(seq__lt=before_seq)
    newest = rows.order_by("-seq").values_list("seq", "kind", "payload")[:limit]
    return [StoredEvent(seq, kind, payload) for seq, kind, payload in reversed(list(newest))]


def create_chat(owner, *, title: str = "", model: str = "") -> ChatSession:
    language = translation.get_language() or ""  # the creator's page's (or request's)
    return ChatSession.objects.create(
        owner=owner, title=title[:200], model=model, language=language
    )


def state_events_after(
    chat_id, after_seq: int, *, call_ids: list[str], input_seqs: list[int]
) -> list[StoredEvent]:
    """Status events (tool calls, taken inputs) after a page, for the page's calls and inputs."""
    if not call_ids and not input_seqs:
        return []
    wanted = Q(kind__in=["tool_start", "tool_end", "approval_required", "approval_decided"]) & Q(
        payload__call_id__in=call_ids
    )
    if input_seqs:
        wanted |= Q(kind="input_taken", payload__input_seq__in=input_seqs)
    rows = (
        ChatEvent.objects.filter(chat_id=chat_id, channel=DISPLAY, seq__gt=after_seq)
        .filter(wanted)
        .order_by("seq")
        .values_list("seq", "kind", "payload")
    )
    return [StoredEvent(seq, kind, payload) for seq, kind, payload in rows]


def last_display_seq(chat_id) -> int:
    return ChatSession.objects.values_list("last_display_seq", flat=True).get(pk=chat_id)


def display_seq_now(chat_id) -> int:
    """The chat's last display seq (0 for a chat that is gone): a socket's quiet check asks
    it every few seconds per page, so it is a fixed statement, written out."""
    opts = ChatSession._meta
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {quote(opts.get_field('last_display_seq').column)} FROM {quote(opts.db_table)}"
        f" WHERE {quote(opts.pk.column)} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [opts.pk.get_db_prep_value(chat_id, connection)])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def latest_display_payload(chat_id, kind: str) -> dict[str, Any] | None:
    """The payload of the newest display event of ``kind`` (e.g. the context gauge)."""
    return (
        ChatEvent.objects.filter(chat_id=chat_id, channel=DISPLAY, kind=kind)
        .filter(on_path(branch_shape(chat_id).path()))
        .order_by("-seq")
        .values_list("payload", flat=True)
        .first()
    )


def run_events(chat_id, run_id: str, kinds: Iterable[str]) -> list[StoredEvent]:
    """The display events of ``kinds`` that one run wrote, oldest first."""
    rows = (
        ChatEvent.objects.filter(
            chat_id=chat_id, channel=DISPLAY, kind__in=sorted(kinds), payload__run_id=str(run_id)
        )
        .order_by("seq")
        .values_list("seq", "kind", "payload")
    )
    return [StoredEvent(seq, kind, payload) for seq, kind, payload in rows]


def open_tool_calls(chat_id, run_id: str) -> list[tuple[str, str]]:
    """(call id, tool name) of the run's tool calls that started and have not ended."""
    started: dict[str, str] = {}
    for event in run_events(chat_id, run_id, ("tool_start", "tool_end")):
        call_id = str(event.payload.get("call_id", ""))
        if event.kind == "tool_start":
            started[call_id] = str(event.payload.get("name", ""))
        else:
            started.pop(call_id, None)
    return list(started.items())


# --- branches ------------------------------------------------------------------------------------
# A branch is a pointer: fork and switch events in the display log (chat.core.branches),
# and a ``restore`` of the context channel to the new branch's context, in one transaction.


def branch_shape(chat_id) -> branches.Structure:
    """The chat's branches, from its fork and switch events (none for most chats).

    A fixed statement, written out: it is read for every page, every resync and every
    doorbell with a message in it (on the database thread), and building it with the
    ORM cost more than running it.
    """
    opts = ChatEvent._meta
    quote = connection.ops.quote_name
    payload = opts.get_field("payload")
    columns = ", ".join(quote(opts.get_field(name).column) for name in ("seq", "kind", "payload"))
    sql = (
        f"SELECT {columns} FROM {quote(opts.db_table)} "
        f"WHERE {quote(opts.get_field('chat').column)} = %s AND {_BRANCH_KINDS_SQL}"
    )
    chat = opts.get_field("chat").get_db_prep_value(chat_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [chat])
        rows = cursor.fetchall()
    return branches.structure(
        (seq, kind, payload.from_db_value(value, None, connection)) for seq, kind, value in rows
    )


# Read on every page and every resync, and most chats never branch: the partial index
# ``chat_event_branches`` answers it without touching the chat's other events. SQLite uses
# a partial index only for a query that repeats its condition literally (a bound parameter
# cannot prove it), and the chat's (chat, channel, seq) index must not look better: the
# condition is written out, and the channel left out (forks and switches are display events).
assert all(kind.isidentifier() for kind in branches.KINDS)
_BRANCH_KINDS_SQL = "kind IN ({})".format(", ".join(f"'{kind}'" for kind in branches.KINDS))


def on_path(path: branches.Path) -> Q:
    """The rows of a path (every row when the chat never branched)."""
    if path.whole:
        return Q()
    if not path.spans:
        return Q(pk__in=[])
    wanted = Q()
    for lo, hi in path.spans:
        wanted |= Q(seq__gte=lo) if hi is None else Q(seq__gte=lo, seq__lt=hi)
    return wanted


def _session_seq(chat_id) -> int:
    return ChatSession.objects.values_list("last_session_seq", flat=True).get(pk=chat_id)


def fork(chat_id, *, parent: int, at: int, context: list[ChatMessage]) -> list[ChatEvent]:
    """Start a branch from the path of ``parent`` before seq ``at``, with ``context``."""
    payload = {"type": branches.FORK, "parent": parent, "at": at, "ctx": _session_seq(chat_id)}
    rows = append_display(chat_id, [payload])
    restore_context(chat_id, context)
    return rows


def switch_branch(chat_id, *, to: int, context: list[ChatMessage]) -> list[ChatEvent]:
    """Make branch ``to`` current again, with ``context`` (its context when it was left)."""
    payload = {"type": branches.SWITCH, "to": to, "ctx": _session_seq(chat_id)}
    rows = append_display(chat_id, [payload])
    restore_context(chat_id, context)
    return rows


def context_marker(chat_id, input_seq: int) -> int | None:
    """The seq of the context event of the user message shown at ``input_seq``, if taken."""
    return (
        ChatEvent.objects.filter(
            chat_id=chat_id, channel=SESSION, kind=eventlog.MSG, payload__extra__input_seq=input_seq
        )
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )


def context_until(chat_id, seq: int) -> list[ChatMessage]:
    """The context as it stood once session event ``seq`` was written (repaired)."""
    events = ChatEvent.objects.filter(chat_id=chat_id, channel=SESSION, seq__lte=seq)
    reset_seq = events.filter(kind__in=[eventlog.CLEAR, eventlog.RESTORE]).aggregate(
        seq=Max("seq")
    )["seq"]
    if reset_seq is not None:
        events = events.filter(seq__gte=reset_seq)
    return eventlog.load(events.order_by("seq").values_list("payload", flat=True)).messages


def any_display_of(
    chat_id, kinds: Iterable[str], after: int, before: int, path: branches.Path
) -> bool:
    """Whether the path has an event of ``kinds`` strictly between two seqs."""
    rows = ChatEvent.objects.filter(
        chat_id=chat_id, channel=DISPLAY, kind__in=list(kinds), seq__gt=after, seq__lt=before
    )
    return rows.filter(on_path(path)).exists()
