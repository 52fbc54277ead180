"""Pages of a chat's messages: the newest items of the active path, with their states
and the version switchers of the messages that have versions (chat.core.branches).

The chat page, its older pages and the re-render pushed when the path changes (an edit,
a regeneration, a switch of version) all come from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from chat import store
from chat.core import branches
from chat.presentation import display

PAGE_ITEMS = 50
VERSIONED = display.VERSION_ITEMS
EVENT_BATCH = 200


@dataclass
class Page:
    chat_id: Any
    items: list[display.DisplayItem]
    has_older: bool
    # The newest event the read saw (0: none): where the page's socket resumes.
    newest_seq: int = 0

    @property
    def first_seq(self) -> int:
        return self.items[0].seq if self.items else 0

    @property
    def html(self) -> str:
        """The items, each through its partial, as the live push renders them."""
        return mark_safe(display.render_items(self.chat_id, self.items))  # noqa: S308


def page_of_items(
    chat_id,
    before_seq: int | None = None,
    limit: int = PAGE_ITEMS,
    *,
    shape: branches.Structure | None = None,
) -> Page:
    """The newest ``limit`` items of the active path before ``before_seq``, with their
    states folded in."""
    shape = store.branch_shape(chat_id) if shape is None else shape
    events: list[store.StoredEvent] = []
    cursor = before_seq
    while True:
        batch = store.display_events_before(chat_id, cursor, EVENT_BATCH, shape=shape)
        events = batch + events
        items = display.build_items(events)
        if len(batch) < EVENT_BATCH or len(items) > limit:
            break
        cursor = batch[0].seq
    has_older = len(items) > limit or (
        bool(events) and events[0].seq > 1 and len(batch) == EVENT_BATCH
    )
    items = items[-limit:]
    if before_seq is not None and items:
        # An older page: statuses of its calls may have been written after it.
        later = store.state_events_after(
            chat_id,
            events[-1].seq,
            call_ids=display.call_ids(items),
            input_seqs=[i.seq for i in items if i.queued],
        )
        if later:
            items = display.build_items([e for e in events if e.seq >= items[0].seq], later)
    if shape.branched and items:
        _mark_versions(items, shape, first_event=events[0].seq, whole=not has_older)
    return Page(chat_id, items, has_older, events[-1].seq if events else 0)


def resume_seq(chat: Any, page: Page) -> int:
    """The seq a newest page tells its socket it has (``#seq-marker``).

    The chat row is read before the page's events: a reply written in between is on
    the page but not in the row's count, and a marker from the row alone had the
    socket's resync push that reply a second time (two copies of one reply).
    """
    return max(chat.last_display_seq, page.newest_seq)


def _mark_versions(
    items: list[display.DisplayItem], shape: branches.Structure, *, first_event: int, whole: bool
) -> None:
    """Give the first item after each branch point its switcher ("‹ 2/3 ›")."""
    for group in shape.versions():
        if group.base < first_event - 1 and not whole:
            continue  # the item after it may be on an older page
        item = next((i for i in items if i.seq > group.base and i.kind in VERSIONED), None)
        if item is not None:
            item.versions = group


def message_list(chat_id, upto: int, shape: branches.Structure | None = None) -> str:
    """The whole message list up to ``upto``, swapped in place of the page's (out of band):
    what every open page of the chat shows once the path has changed."""
    page = page_of_items(chat_id, upto + 1, shape=shape)
    chat = SimpleNamespace(pk=chat_id)
    return render_to_string("chat/_message_list.html", {"page": page, "chat": chat})


def mark_new_versions(
    chat_id,
    items: list[display.DisplayItem],
    first_event: int,
    shape: branches.Structure | None = None,
) -> None:
    """Give items just written their switcher: the first item after the newest branch point
    (a regenerated reply, an edited message) when nothing shown comes between them.
    ``shape``: the chat's branches if the caller read them already (a resync's batch did)."""
    items = [i for i in items if i.kind in VERSIONED]
    if not items:
        return
    shape = store.branch_shape(chat_id) if shape is None else shape
    groups = shape.versions()
    if not groups:
        return
    group = groups[-1]
    item = next((i for i in items if i.seq > group.base), None)
    if item is None:
        return
    if group.base + 1 < first_event and store.any_display_of(
        chat_id, display.VERSION_EVENTS, group.base, first_event, shape.path()
    ):
        return
    if any(i.seq > group.base and i.seq < item.seq for i in items):
        return
    item.versions = group
