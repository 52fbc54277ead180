"""What a resync batch costs (``fragments.next_batch``): its statements and its renders.

bench_longchat's replay of 1,000 events behind read 10 ms higher after issue 16's work
than before it: each batch read the chat's branches twice (three statements, one before),
and rendered every context gauge and call status of the batch, though each replaces the
one before it by id and only the last shows (translated templates made each dearer).
These fix the counts, so that coming back fails here rather than in a noisy benchmark.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat import store
from chat.agent import events as ev
from chat.core import eventlog
from chat.core.messages import ToolCall, assistant, tool_result, user
from chat.presentation import display, fragments

pytestmark = [pytest.mark.persistence, pytest.mark.django_db]

TURNS = 4


def _payload(event: ev.RunEvent, chat_id: str) -> dict:
    event.chat_id, event.run_id = chat_id, "00000000-0000-0000-0000-000000000000"
    payload = event.to_dict()
    payload.pop("seq", None)
    return payload


@pytest.fixture
def chat_id(alice) -> str:
    """Turns as runs write them: a user message, run events, a tool call with two
    context gauges around it, the tool's result, a reply and ``complete``."""
    chat_id = str(store.create_chat(alice, title="replay", model="demo").pk)
    stamp = store.now_ms()
    payloads = []
    for turn in range(1, TURNS + 1):
        call = ToolCall(f"call_{turn}", "calculator", '{"expression": "1+1"}')
        payloads += [
            eventlog.msg_event(user(f"question {turn}"), stamp),
            _payload(ev.RunStart(model="demo"), chat_id),
            _payload(ev.ContextUsage(tokens=1000 * turn, context_window=32_000), chat_id),
            eventlog.msg_event(assistant("", tool_calls=[call]), stamp),
            _payload(ev.ToolStart(call_id=call.id, name=call.name, input={}), chat_id),
            _payload(
                ev.ToolEnd(call_id=call.id, name=call.name, output="2", status="done"), chat_id
            ),
            eventlog.msg_event(tool_result(call.id, "2"), stamp),
            _payload(ev.ContextUsage(tokens=1000 * turn + 500, context_window=32_000), chat_id),
            eventlog.msg_event(assistant(f"answer {turn}"), stamp),
            _payload(ev.Complete(input_tokens=1, output_tokens=1, text=""), chat_id),
        ]
    store.append_display(chat_id, payloads)
    return chat_id


def test_a_resync_batch_reads_the_branches_once_and_its_events(chat_id):
    with CaptureQueriesContext(connection) as queries:
        events, html = fragments.next_batch(chat_id, 0)
    assert len(events) == 10 * TURNS and html
    assert len(queries) == 2, [q["sql"] for q in queries.captured_queries]
    with CaptureQueriesContext(connection) as queries:  # the last, empty one: the same two
        assert fragments.next_batch(chat_id, events[-1].seq) == ([], "")
    assert len(queries) == 2


def test_a_batch_renders_one_gauge_and_one_status_per_call(chat_id, monkeypatch):
    made: Counter[str] = Counter()

    def counted(name: str):
        real = getattr(fragments, name)

        def counting(*args, **kwargs):
            made[args[0] if name == "_oob" else name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(fragments, name, counting)

    for name in ("gauge", "run_status", "controls", "_oob"):
        counted(name)
    statuses: list[int] = []
    status_for = fragments._status_for

    def counting_status(event):
        statuses.append(event.seq)
        return status_for(event)

    monkeypatch.setattr(fragments, "_status_for", counting_status)
    _events, html = fragments.next_batch(chat_id, 0)
    # One gauge, one status per call, the run's status line and its controls; the
    # messages' items come from display.render_item (cached). (The fixed fragments'
    # shapes are rendered once per language through _oob: not counted, cached.)
    made.pop("chat/_gauge.html", None)
    made.pop("chat/_run_status.html", None)
    made.pop("chat/_controls.html", None)
    assert made == Counter(
        {"gauge": 1, "run_status": 1, "controls": 1, "chat/_call_status.html": TURNS}
    )
    assert statuses == []  # the batch ends with the run's end: no status line to make
    events = store.display_events_after(chat_id, 0)[:-1]  # up to the last run's reply
    fragments.fragments_for_events(events, chat_id)
    assert statuses == [[e.seq for e in events if e.kind in fragments.STATUS_KINDS][-1]]
    # The swaps that show are the last ones: the newest usage, each call's last status.
    assert html.count('id="context-gauge"') == 1
    assert f'aria-valuenow="{1000 * TURNS + 500}"' in html
    for turn in range(1, TURNS + 1):
        dom_id = re.escape(f'id="call-status-{display.call_dom_id(f"call_{turn}")}"')
        swaps = re.findall(rf'status-(\w+)" {dom_id} hx-swap-oob="true"', html)
        assert swaps == ["done"], (turn, swaps)
        swap = re.search(rf'{dom_id} hx-swap-oob="true"', html)
        assert swap is not None  # after its call's item, before the next turn's
        assert html.index(f"question {turn}") < swap.start()
        assert turn == TURNS or swap.start() < html.index(f"question {turn + 1}")


def test_the_status_line_is_the_last_events(chat_id):
    def status(html: str) -> str:
        start = html.rindex('id="run-status"')
        return html[html.index(">", start) + 1 : html.index("</div>", start)]

    events = store.display_events_after(chat_id, 0)
    ended = [e for e in events if e.kind == "complete"][0].seq
    # Up to the tool's start: "Using calculator…"; a run that ended: no status.
    started = [e for e in events if e.kind == "tool_start"][0].seq
    assert status(fragments.fragments_for_events(events[:started], chat_id)) == (
        "Using calculator…"
    )
    assert status(fragments.fragments_for_events(events[:ended], chat_id)) == ""
    run_start = [e for e in events if e.kind == "run_start"][1].seq
    assert status(fragments.fragments_for_events(events[:run_start], chat_id)) == "Thinking…"


@pytest.mark.parametrize(
    "kind",
    sorted(fragments.STATUS_KINDS)
    + ["msg", "complete", "error", "context_usage", "input_taken", "title", "approval_decided"],
)
def test_the_status_kinds_are_the_kinds_with_a_status_text(kind):
    has_text = fragments._status_for(store.StoredEvent(1, kind, {})) is not None
    assert has_text == (kind in fragments.STATUS_KINDS)
