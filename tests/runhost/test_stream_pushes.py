"""How a run publishes the reply it is writing: coalesced snapshots, rendered once."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async

from chat import actions, store
from chat.agent import events as ev
from chat.live import doorbell as live_doorbell
from chat.live.layers import LeanInMemoryChannelLayer, live_layer
from chat.models import Run
from chat.presentation import fragments, markdown
from chat.presentation.markdown import render_markdown_uncached
from chat.runhost import host as run_host

pytestmark = [pytest.mark.django_db(transaction=True)]
INTERVAL = 0.2


@pytest.fixture
async def host(alice, agent, settings, monkeypatch):
    settings.LYCEUM_STREAM_PUSH_INTERVAL = INTERVAL
    chat = await database_sync_to_async(actions.new_chat)(alice)
    run = await Run.objects.acreate(chat=chat, model="demo-fast")
    made = run_host.DjangoRunHost(run, [])
    made.pushed = []

    async def capture(chat_id, message, keep=None):
        made.pushed.append(message)

    def capture_now(chat_id, make_message):
        made.pushed.append(make_message())
        return True

    monkeypatch.setattr(run_host, "aring", capture)
    monkeypatch.setattr(run_host, "ring_now", capture_now)
    yield made
    made.stop_pushing()


async def test_the_first_text_goes_out_at_once_and_later_text_within_one_interval(host):
    await host.stream_update("Hello", "")
    await asyncio.sleep(0.02)
    assert [m["text"] for m in host.pushed] == ["Hello"]

    await host.stream_update("Hello wor", "")
    await host.stream_update("Hello world", "")
    await asyncio.sleep(0.02)
    assert len(host.pushed) == 1  # coalesced: not before the interval is over

    await asyncio.sleep(INTERVAL)  # no more text arrives: the last text still goes out
    assert [m["text"] for m in host.pushed] == ["Hello", "Hello world"]


async def test_text_read_once_per_interval_goes_out_as_it_arrives(host):
    # As from an upstream read once per interval (chat.catalog): the first text, a
    # batch a third of an interval later, then a batch every interval. Pushes a whole
    # interval apart would keep every later batch waiting two thirds of an interval.
    text, arrived = "", {}
    for i, delay in enumerate([0.0, INTERVAL / 3] + [INTERVAL] * 5):
        await asyncio.sleep(delay)
        text += f"w{i} "
        arrived[text] = time.time()
        await host.stream_update(text, "")
    await asyncio.sleep(INTERVAL)

    lags = {m["text"]: m["sent_at"] - arrived[m["text"]] for m in host.pushed}
    assert list(lags) == list(arrived)  # every batch went out, once, in order
    late = [round(lag, 3) for t, lag in lags.items() if t.count(" ") > 3 and lag > INTERVAL / 3]
    assert late == []


async def test_a_snapshot_carries_the_rendered_markdown_for_the_page(host):
    await host.stream_update("Some **bold**\n\n- a list", "thinking…")
    await asyncio.sleep(0.02)
    (message,) = host.pushed
    assert message["type"] == "chat.stream"
    assert message["run_id"] == str(host.run.pk)
    assert render_markdown_uncached("Some **bold**\n\n- a list") in message["html"]
    assert "thinking…" in message["html"]
    assert 'id="stream"' in message["html"] and 'hx-swap-oob="true"' in message["html"]


async def test_a_written_reply_drops_the_snapshot_still_due(host):
    await host.stream_update("Hello", "")
    await asyncio.sleep(0.02)
    await host.stream_update("Hello world", "")
    host.channels.display.append(run_host.assistant("Hello world"))
    host.take_new_display()  # the reply is written now

    await asyncio.sleep(INTERVAL + 0.05)
    assert [m["text"] for m in host.pushed] == ["Hello"]


async def test_pushes_do_not_overlap_and_the_one_waiting_goes_out_after(host, monkeypatch):
    release = asyncio.Event()

    async def slow(chat_id, message, keep=None):
        host.pushed.append(message)
        await release.wait()

    monkeypatch.setattr(run_host, "aring", slow)
    monkeypatch.setattr(run_host, "ring_now", lambda chat_id, make: False)  # a layer that waits
    await host.stream_update("one", "")
    await asyncio.sleep(0.02)
    await host.stream_update("one two", "")
    await asyncio.sleep(INTERVAL + 0.05)
    assert [m["text"] for m in host.pushed] == ["one"]  # the layer is still busy

    release.set()
    await asyncio.sleep(0.05)
    assert [m["text"] for m in host.pushed] == ["one", "one two"]


async def test_on_the_in_memory_layer_a_snapshot_goes_out_without_a_task(host, monkeypatch):
    monkeypatch.setattr(run_host, "ring_now", live_doorbell.ring_now)
    layer = live_layer()
    assert isinstance(layer, LeanInMemoryChannelLayer)
    channel = await layer.new_channel()
    await layer.group_add(live_doorbell.chat_group(host.chat_id), channel)
    made = []
    monkeypatch.setattr(asyncio, "ensure_future", lambda *a, **k: made.append(a))

    await host.stream_update("Hello", "")
    await asyncio.sleep(0.02)
    message = await asyncio.wait_for(layer.receive(channel), 1)
    assert (message["type"], message["text"]) == ("chat.stream", "Hello")
    assert "Hello" in message["html"]
    assert made == [] and host._pushing is None


def _kinds(chat_id) -> list[str]:
    return [e.kind for e in store.display_events_after(chat_id, 0, 100)]


async def test_a_reply_starting_is_written_in_one_go_with_one_doorbell(host):
    await host.emit(ev.RunStart(model="demo-fast"))
    await host.emit(ev.IterationStart(iteration=1, max_iterations=12))
    await host.emit(ev.ContextUsage(tokens=10, context_window=1000))
    assert await database_sync_to_async(_kinds)(host.chat_id) == []  # not yet

    await asyncio.sleep(run_host.EVENT_BATCH_DELAY + 0.1)

    kinds = await database_sync_to_async(_kinds)(host.chat_id)
    assert kinds[-3:] == ["run_start", "iteration_start", "context_usage"]
    assert [m["type"] for m in host.pushed] == ["chat.events"]
    run = await Run.objects.aget(pk=host.run.pk)
    assert run.iteration == 1


async def test_anything_else_the_run_writes_comes_after_what_it_announced(host):
    await host.emit(ev.RunStart(model="demo-fast"))
    await host.emit(ev.ToolStart(call_id="c1", name="calculator", input={}))
    await host.stream_update("Hello", "")
    await asyncio.sleep(0.02)

    kinds = await database_sync_to_async(_kinds)(host.chat_id)
    assert kinds[-2:] == ["run_start", "tool_start"]
    assert [m["type"] for m in host.pushed] == ["chat.events", "chat.stream"]


async def test_the_first_snapshot_waits_for_the_announcements(host):
    await host.emit(ev.RunStart(model="demo-fast"))
    await host.stream_update("Hello", "")
    await asyncio.sleep(0.02)

    assert await database_sync_to_async(_kinds)(host.chat_id) == ["run_start"]
    assert [m["type"] for m in host.pushed] == ["chat.events", "chat.stream"]


# --- what a written reply's doorbell carries ---------------------------------------------------


def _fragments_from_the_log(chat_id, after: int, upto: int) -> str:
    events = [e for e in store.display_events_after(chat_id, after) if e.seq <= upto]
    return fragments.fragments_for_events(events, str(chat_id))


async def test_the_doorbell_carries_the_fragments_a_subscriber_would_read_from_the_log(host):
    await host.emit(ev.RunStart(model="demo-fast"))
    await host.emit(ev.IterationStart(iteration=1, max_iterations=12))
    text = "Here is **the answer**:\n\n- one\n- two `code`\n\nDone."
    await host.stream_update(text, "")
    host.channels.push_both(run_host.assistant(text))
    await host.commit()

    doorbells = [m for m in host.pushed if m["type"] == "chat.events"]
    # The run's start and the reply, written in one transaction: one doorbell.
    assert len(doorbells) == 1
    for doorbell in doorbells:
        expected = await database_sync_to_async(_fragments_from_the_log)(
            host.chat_id, doorbell["after"], doorbell["seq"]
        )
        assert doorbell["html"] == expected
    reply = doorbells[-1]
    assert reply["seq"] == reply["after"] + 3  # run_start, iteration_start, the message
    assert reply["rounds"] == [(str(host.run.pk), 0)]
    assert render_markdown_uncached(text) in reply["html"]


async def test_a_written_reply_reuses_the_html_its_stream_was_rendered_to(host, monkeypatch):
    text = "A *streamed* reply\n\n1. with\n2. a list"
    await host.stream_update(text[:20], "")
    await asyncio.sleep(0.02)
    expected = render_markdown_uncached(text)
    rendered_whole: list[str] = []

    def counting(source: str) -> str:
        rendered_whole.append(source)
        return render_markdown_uncached(source)

    monkeypatch.setattr(markdown, "render_markdown_uncached", counting)
    host.channels.push_both(run_host.assistant(text))
    await host.commit()

    assert markdown.render_markdown(text) == expected
    assert rendered_whole == []  # the stream's renderer made it


async def test_a_reply_defining_a_link_reference_is_rendered_whole(host):
    # The one case where the stream's renderer differs from the whole text's: the link
    # was rendered before its definition arrived.
    text = "See [the docs][d].\n\nAnd more.\n\n[d]: https://example.com/docs"
    await host.stream_update(text[:30], "")
    await asyncio.sleep(0.02)
    host.channels.push_both(run_host.assistant(text))
    await host.commit()

    link = 'href="https://example.com/docs"'
    assert link in host.pushed[-1]["html"]
    assert link in markdown.render_markdown(text)
