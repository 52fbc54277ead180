"""HTML fragments pushed over the chat socket, swapped out of band by htmx's ws extension.

Every frame is a handful of top-level elements: new items appended to
``#messages``, small replacements of status elements by id, and a ``#seq-marker``
carrying the display ``seq`` the page has now seen (the resync cursor).
Rendering uses the same partials as the full page.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from django.template.defaultfilters import linebreaksbr
from django.template.loader import render_to_string
from django.utils.html import escape
from django.utils.translation import get_language, gettext

from chat import artifacts, store
from chat.catalog import available_models
from chat.core import branches
from chat.core.voices import Voices, VoiceSplitter
from chat.presentation import display, pages
from chat.presentation.markdown import render_markdown_uncached
from chat.store import StoredEvent

logger = logging.getLogger(__name__)

TERMINAL = {"complete", "cancelled", "error"}

# Another app's out-of-band fragments for display events of a kind (the classroom's
# scene panel and cast, pushed with a scene marker), registered in its ``ready()``:
# chat never imports those apps. Called with the chat's id and the batch's last event
# of the kind; it renders the state as it is now, so a resync from the log shows it too.
EventFragment = Callable[[str, StoredEvent], str]
_event_fragments: dict[str, EventFragment] = {}


def register_event_fragment(kind: str, render: EventFragment) -> None:
    _event_fragments[kind] = render


def _registered_fragments(events: list[StoredEvent], chat_id: str) -> list[str]:
    last: dict[str, StoredEvent] = {}
    for event in events:
        if event.kind in _event_fragments:
            last[event.kind] = event
    parts = []
    for kind, event in last.items():
        try:
            parts.append(_event_fragments[kind](chat_id, event))
        except Exception:  # noqa: BLE001 - another app's panel must not stop the chat's push
            logger.warning("%s fragment for chat %s failed", kind, chat_id, exc_info=True)
    return parts


def _oob(template: str, **context: Any) -> str:
    return render_to_string(template, {"oob": True, **context})


def append_items(html: str) -> str:
    return f'<div hx-swap-oob="beforeend:#messages">{html}</div>'


def seq_marker(seq: int) -> str:
    return f'<div id="seq-marker" data-seq="{int(seq)}" hx-swap-oob="true"></div>'


def run_status(text: str) -> str:
    """The run's status line (a few texts, each rendered once: every run's start and end
    pushed two of them, rendered on the database thread)."""
    return _run_status(text)


@lru_cache(maxsize=64)
def _run_status(text: str) -> str:
    return _oob("chat/_run_status.html", status_text=text)


def controls(busy: bool, chat_id: str) -> str:
    """The stop button or the regenerate and compact ones, rendered once per language
    with a stand-in for the chat's id (as the title)."""
    return _controls_shape(get_language(), busy).replace(_TITLE_PK, str(chat_id))


@lru_cache(maxsize=16)
def _controls_shape(language: str | None, busy: bool) -> str:
    return _oob("chat/_controls.html", busy=busy, chat_id=_TITLE_PK)


def stream_slot(
    run_id: str = "",
    text_html: str = "",
    reasoning: str = "",
    voices: list[tuple[str, str]] | None = None,
    *,
    oob: bool = True,
) -> str:
    """The reply being written; ``text_html`` is its rendered, sanitised markdown.

    A run with several speakers passes ``voices`` instead: (speaker, rendered html)
    per reply so far, each shown as a bubble labelled with its speaker.
    """
    if voices is not None and run_id:
        return _voices_slot(run_id, reasoning, voices, oob)
    if not run_id:
        return _stream_slot_uncached(run_id, text_html, reasoning, oob)
    values = {
        _SLOT_RUN: escape(run_id),
        _SLOT_REASONING: linebreaksbr(reasoning, autoescape=True) if reasoning else "",
        _SLOT_TEXT: text_html,
    }
    shape = _stream_shape(get_language(), oob, bool(reasoning), bool(text_html))
    return "".join(values.get(part, part) for part in shape)


def _stream_slot_uncached(run_id: str, text_html: str, reasoning: str, oob: bool) -> str:
    return render_to_string(
        "chat/_stream.html",
        {"oob": oob, "run_id": run_id, "text_html": text_html, "reasoning": reasoning},
    )


# Stand-ins for the stream slot's run id, reasoning and reply (see _stream_shape): no
# template changes them (escaping and line breaks leave them as they are).
_SLOT_RUN = "\ue000run\ue000"
_SLOT_REASONING = "\ue000reasoning\ue000"
_SLOT_TEXT = "\ue000text\ue000"
_SLOT_PARTS = re.compile(f"({_SLOT_RUN}|{_SLOT_REASONING}|{_SLOT_TEXT})")


@lru_cache(maxsize=32)
def _stream_shape(language: str | None, oob: bool, reasoning: bool, text: bool) -> tuple[str, ...]:
    """The slot of a run's reply being written, rendered once per language and shape
    (with or without reasoning, with or without text): its pieces of HTML and the
    stand-ins between them, which :func:`stream_slot` fills in (escaped as the template
    escapes them). A stream pushes this several times a second: rendering the template
    each time was a fifth of the push's CPU. Split, not replaced: the reply's own text
    may hold a stand-in's characters.
    """
    html = _stream_slot_uncached(
        _SLOT_RUN, _SLOT_TEXT if text else "", _SLOT_REASONING if reasoning else "", oob
    )
    return tuple(part for part in _SLOT_PARTS.split(html) if part)


def _voices_slot(run_id: str, reasoning: str, voices: list[tuple[str, str]], oob: bool) -> str:
    """One bubble per speaker. Pushed several times a second per run: only the last
    bubble grows, so the ones before it are rendered once (cached), and the wrapper is
    a string, which keeps a push to one template render, as for a single reply."""
    language = get_language()
    last = len(voices) - 1
    bubbles = [
        (_voice_bubble if index < last else _voice_bubble_uncached)(
            name, html, index == last, reasoning if index == 0 else "", language
        )
        for index, (name, html) in enumerate(voices)
    ] or [_voice_bubble_uncached("", "", True, reasoning, language)]
    return _voices_open(language, oob).format(escape(run_id)) + "".join(bubbles) + "</div>"


@lru_cache(maxsize=16)
def _voices_open(language: str | None, oob: bool) -> str:
    """The slot's opening tag, ``{}`` for the run's id (its label in ``language``)."""
    label = escape(gettext("Replies being written")).replace("{", "{{").replace("}", "}}")
    swap = ' hx-swap-oob="true"' if oob else ""
    return f'<div id="stream" class="stream-voices" data-run="{{}}" aria-label="{label}"{swap}>'


def _voice_bubble_uncached(
    speaker: str, html: str, last: bool, reasoning: str, language: str | None
) -> str:
    """A speaker's bubble being written (no speaker: a placeholder for the reasoning
    that comes first). ``language`` keys the cache: the bubble's labels are translated."""
    context = {
        "speaker": speaker,
        "html": html,
        "last": last,
        "reasoning": reasoning,
        "colour": str(display.sender_colour(speaker)),  # a string: no number formatting
    }
    return render_to_string("chat/_stream_voice.html", context)


_voice_bubble = lru_cache(maxsize=256)(_voice_bubble_uncached)


def idle_stream_slot() -> str:
    """The empty slot (nothing being written), pushed after every written reply."""
    return _idle_stream_slot(get_language())


@lru_cache(maxsize=8)
def _idle_stream_slot(language: str | None) -> str:
    return stream_slot()  # its label is in the language it is rendered in


def partial_stream_slot(
    run_id: str, text: str, reasoning: str, speakers: list[str] | None = None, *, oob: bool = True
) -> str:
    """The reply written so far, rendered whole (a page attaching mid-stream)."""
    voices = Voices.from_names(speakers)
    if voices is None:
        html = render_markdown_uncached(text) if text else ""
        return stream_slot(run_id, html, reasoning, oob=oob)
    splitter = VoiceSplitter(voices)
    splitter.feed(text)
    replies = [(name, render_markdown_uncached(said)) for name, said in splitter.replies()]
    return stream_slot(run_id, reasoning=reasoning, voices=replies, oob=oob)


def error_notice(message: str) -> str:
    return _oob("chat/_notice.html", message=message)


def title(chat_id: str, text: str) -> str:
    """The chat's title in the header and in the sidebar list.

    Rendered once per language with stand-ins for the chat's id and title, which are
    then put in (escaped as the template escapes them): every chat's first message
    pushed it, two templates and three URLs, on the database thread.
    """
    if not text:
        return _title_uncached(chat_id, text)
    shape = _title_shape(get_language())
    return shape.replace(_TITLE_PK, str(chat_id)).replace(_TITLE_TEXT, escape(text))


def _title_uncached(chat_id: str, text: str) -> str:
    chat = SimpleNamespace(pk=chat_id, title=text, display_title=text or gettext("New chat"))
    return _oob("chat/_title.html", chat=chat, can_write=True) + _oob(
        "chat/_chat_link.html", c=chat
    )


# Stand-ins no template or URL changes (escape() leaves them as they are) and no chat id
# or escaped title contains.
_TITLE_PK = "00000000-0000-4000-8000-00000000f1e1"
_TITLE_TEXT = "\ue000title\ue000"


@lru_cache(maxsize=16)
def _title_shape(language: str | None) -> str:
    return _title_uncached(_TITLE_PK, _TITLE_TEXT)


def gauge(usage: dict[str, Any]) -> str:
    """The context gauge: rendered once per language with stand-ins for its two numbers
    (each run's start and end pushed one, two translated sentences each)."""
    tokens, window = usage.get("tokens"), usage.get("context_window")
    if type(tokens) is not int or type(window) is not int:
        return _oob("chat/_gauge.html", usage=usage)
    shape = _gauge_shape(get_language())
    return shape.replace(_GAUGE_TOKENS, str(tokens)).replace(_GAUGE_WINDOW, str(window))


# Stand-ins for the gauge's numbers; an int is shown as str() gives it (no thousands
# separator in these settings: tests/presentation/test_fixed_fragments.py checks).
_GAUGE_TOKENS = "\ue000tokens\ue000"
_GAUGE_WINDOW = "\ue000window\ue000"


@lru_cache(maxsize=16)
def _gauge_shape(language: str | None) -> str:
    return _oob(
        "chat/_gauge.html", usage={"tokens": _GAUGE_TOKENS, "context_window": _GAUGE_WINDOW}
    )


def composer_reset(chat_id: str) -> str:
    """The emptied composer, after each send: rendered once per language with a
    stand-in for the chat's id (as the title), on the event loop's thread."""
    return _composer_shape(get_language()).replace(_TITLE_PK, str(chat_id))


@lru_cache(maxsize=16)
def _composer_shape(language: str | None) -> str:
    return _oob("chat/_composer.html", chat_id=_TITLE_PK)


def artifacts_panel(chat_id: str) -> str:
    """The chat's artifacts panel as it stands (read now: it lists the newest)."""
    return _oob("chat/_artifacts_panel.html", chat_id=chat_id, panel=artifacts.panel(chat_id))


def _changes_artifacts(event: StoredEvent) -> bool:
    if event.kind == "artifact":
        return True
    return event.kind == "msg" and bool((event.payload.get("extra") or {}).get("attachments"))


# The kinds that set the run's status line (each has a text in :func:`_status_for`).
STATUS_KINDS = frozenset(
    {
        "run_start",
        "iteration_start",
        "hand_end",
        "tool_end",
        "retrying",
        "compacting",
        "approval_required",
        "hand_start",
        "tool_start",
    }
)


def _status_for(event: StoredEvent) -> str | None:
    p = event.payload
    match event.kind:
        case "run_start" | "iteration_start" | "hand_end" | "tool_end":
            return gettext("Thinking…")
        case "retrying":
            return gettext("Retrying in %(seconds)s s: %(why)s") % {
                "seconds": round(float(p.get("delay", 0))),
                "why": gettext(str(p.get("message") or "")) if p.get("message") else "",
            }
        case "compacting":
            return gettext("Compacting the conversation…")
        case "approval_required":
            return gettext("Waiting for your approval")
        case "hand_start":
            return gettext("Sub-agent %(label)s is working…") % {"label": p.get("label", "")}
        case "tool_start":
            if p.get("name"):
                return gettext("Using %(tool)s…") % {"tool": p["name"]}
            return gettext("Using a tool…")
    return None


def _last_swaps(events: list[StoredEvent]) -> tuple[int, dict[str, int]]:
    """The seq of the batch's last context gauge and of each tool call's last status.

    Each replaces its element by id, so within one frame only the last one shows: a
    resync of 1,000 events rendered 167 gauges and 116 call statuses for 5 and 58
    that show (the templates' translations made each dearer than before issue 16).
    """
    gauge = 0
    calls: dict[str, int] = {}
    for event in events:
        if event.kind == "context_usage":
            gauge = event.seq
        elif event.kind in display.CALL_EVENT_KINDS:
            calls[event.payload.get("call_id", "")] = event.seq
    return gauge, calls


def fragments_for_events(
    events: list[StoredEvent], chat_id: str, *, shape: branches.Structure | None = None
) -> str:
    """What to push for display events just written (oldest first).

    ``shape``: the chat's branches if the caller read them already (a resync's batch).
    """
    if any(event.kind in branches.KINDS for event in events):
        # The path changed (an edit, a regeneration, a switch of version): the whole list.
        return pages.message_list(chat_id, events[-1].seq) + seq_marker(events[-1].seq)
    parts: list[str] = []
    items_html: list[str] = []
    status: str | None = None
    status_from: StoredEvent | None = None  # its text is made once, for the last one
    busy: bool | None = None
    last_gauge, last_call = _last_swaps(events)

    def flush_items() -> None:
        if items_html:
            parts.append(append_items("".join(items_html)))
            items_html.clear()

    ended = False  # a run ended in this batch: what it closes after does not bring it back
    new_items = [item for event in events if (item := display.item_from_event(event))]
    pages.mark_new_versions(chat_id, new_items, events[0].seq if events else 0, shape)
    made = {item.seq: item for item in new_items}
    for event in events:
        if event.kind in STATUS_KINDS and (not ended or event.kind == "run_start"):
            status_from = event
        if event.kind == "run_start":
            busy, ended = True, False
        elif event.kind in TERMINAL:
            status, status_from, busy, ended = "", None, False, True
        item = made.get(event.seq)
        if item is not None:
            items_html.append(display.render_item(item, chat_id=chat_id))
            if _is_main_reply(event) or event.kind in TERMINAL:
                flush_items()
                parts.append(idle_stream_slot())
            if event.kind == "model_switched":
                parts.append(
                    _oob(
                        "chat/_model_picker.html",
                        current=event.payload.get("model"),
                        models=available_models(),
                    )
                )
            continue
        flush_items()
        p = event.payload
        if event.kind in display.CALL_EVENT_KINDS:
            call = display.CallState(p.get("call_id", ""), p.get("name", ""), "")
            call.apply(event.kind, p)
            if last_call[call.id] == event.seq:
                parts.append(_oob("chat/_call_status.html", call=call))
            if event.kind in ("approval_required", "approval_decided"):
                # Only approval events change the approval box; a later tool_start must
                # not blank the decision shown (a loaded page keeps it too).
                parts.append(_oob("chat/_call_approval.html", call=call, chat_id=chat_id))
        elif event.kind == "input_taken":
            seq = int(p.get("input_seq", 0))
            parts.append(f'<span id="queued-{seq}" hx-swap-oob="true"></span>')
        elif event.kind == "context_usage":
            if event.seq == last_gauge:
                parts.append(gauge(p))
        elif event.kind == "title":
            parts.append(title(chat_id, p.get("title", "")))
    flush_items()
    if status_from is not None:
        status = _status_for(status_from)
    if status is not None:
        parts.append(run_status(status))
    if busy is not None:
        parts.append(controls(busy, chat_id))
    if any(_changes_artifacts(event) for event in events):
        parts.append(artifacts_panel(chat_id))
    if _event_fragments:
        parts.extend(_registered_fragments(events, chat_id))
    if events:
        parts.append(seq_marker(events[-1].seq))
    return "".join(parts)


def written_rounds(events: list[StoredEvent]) -> list[tuple[str, int]]:
    """The streamed replies (run id, round) these events write as messages.

    A page drops a late snapshot of a reply it has as a message already.
    """
    rounds = []
    for event in events:
        extra = event.payload.get("extra") or {}
        if event.kind == "msg" and "round" in extra:
            rounds.append((str(extra.get("run_id")), int(extra["round"])))
    return rounds


def _is_main_reply(event: StoredEvent) -> bool:
    """A streamed reply of a run (the main agent's or one of its voices'), now written."""
    p = event.payload
    return p.get("role") == "assistant" and (
        not p.get("sender_name") or "voice" in (p.get("extra") or {})
    )


REPLAY_BATCH = 200


def next_batch(chat_id: str, after_seq: int) -> tuple[list[StoredEvent], str]:
    """The next display events after ``after_seq`` (at most a batch) and their fragments.

    Read and rendered in one go, so the socket makes one trip to the database thread
    per batch of a resync.
    """
    shape = store.branch_shape(chat_id)
    if shape.last_seq > after_seq:
        # The path changed since: the page gets the list of the path now, and the cursor
        # moves past the change (a marker event, shown as nothing).
        upto = store.last_display_seq(chat_id)
        page = pages.page_of_items(chat_id, upto + 1, shape=shape)
        shown = [StoredEvent(i.seq, "msg", i.payload) for i in page.items if i.message]
        html = pages.message_list(chat_id, upto, shape) + seq_marker(upto)
        return [*shown, StoredEvent(upto, "path", {})], html
    events = store.display_events_after(chat_id, after_seq, REPLAY_BATCH, shape=shape)
    return events, fragments_for_events(events, chat_id, shape=shape) if events else ""
