"""§6 The small things, below the page (issue 15): the gauge from the provider's usage,
"Compact now" on an empty chat, run status in words, a write_file approval that shows the
file, exports whose speakers cannot be mistaken, one key per "Create key"."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import reverse

from chat import actions, store
from chat.agent import events as ev
from chat.agent.builtin_tools import default_registry
from chat.agent.loop import AgentLoop, LoopConfig
from chat.agent.workspace import Workspace
from chat.core.eventlog import msg_event
from chat.core.messages import assistant, user
from chat.llm.types import Usage
from chat.models import ApiKey
from chat.presentation import display, exports, fragments
from chat.store import StoredEvent
from tests.agent.fakes import MemoryHost, ScriptedProvider, text_reply

# --- the context gauge ------------------------------------------------------------------------


async def test_gauge_is_set_from_the_providers_usage_after_each_reply(tmp_path: Path) -> None:
    host = MemoryHost(prompt="Be kind.")
    host.send("Hello")
    provider = ScriptedProvider([text_reply("Hi there!", usage=Usage(1234, 56))])
    loop = AgentLoop(
        host,
        provider,
        default_registry(),
        LoopConfig(model="test-model"),
        workspace=Workspace(tmp_path),
        chat_id="chat-1",
    )
    await loop.run()
    usages = host.events_of(ev.ContextUsage)
    assert usages[0].measured is False  # our estimate before the request
    assert (usages[-1].tokens, usages[-1].measured) == (1234 + 56, True)
    assert usages[-1].context_window == 32_000


async def test_an_estimated_usage_does_not_overwrite_the_gauge(tmp_path: Path) -> None:
    host = MemoryHost()
    host.send("Hello")
    provider = ScriptedProvider([text_reply("Hi!", usage=None)])
    loop = AgentLoop(
        host,
        provider,
        default_registry(),
        LoopConfig(model="test-model"),
        workspace=Workspace(tmp_path),
        chat_id="chat-1",
    )
    await loop.run()
    assert [u.measured for u in host.events_of(ev.ContextUsage)] == [False]


# --- compact now on an empty chat -------------------------------------------------------------


@pytest.mark.django_db
def test_compact_now_on_an_empty_chat_says_there_is_nothing_to_compact(alice, agent):
    chat = actions.new_chat(alice)
    with pytest.raises(actions.ActionError, match="nothing to compact"):
        actions.request_compaction(alice, chat.pk)
    assert not chat.runs.exists()


@pytest.mark.django_db
def test_compact_now_with_messages_starts_a_compaction(alice, agent, settings, monkeypatch):
    monkeypatch.setattr(actions, "launch_on_commit", lambda *a, **k: None)
    chat = actions.new_chat(alice)
    store.restore_context(chat.pk, [user("hi"), assistant("hello")])
    run_id = actions.request_compaction(alice, chat.pk)
    assert chat.runs.get().pk.hex == run_id.replace("-", "")


# --- run status in words ------------------------------------------------------------------------


def _events(*kinds_payloads: tuple[str, dict]) -> list[StoredEvent]:
    return [
        StoredEvent(seq=i + 1, kind=kind, payload={"type": kind, **payload})
        for i, (kind, payload) in enumerate(kinds_payloads)
    ]


def _status(html: str) -> str:
    start = html.rindex('id="run-status"')
    return html[html.index(">", start) + 1 : html.index("</div>", start)]


def test_run_status_is_in_human_words():
    def status_after(*events: tuple[str, dict]) -> str:
        return _status(fragments.fragments_for_events(_events(*events), "c1"))

    assert status_after(("run_start", {})) == "Thinking…"
    assert status_after(("iteration_start", {"iteration": 3, "max_iterations": 12})) == "Thinking…"
    assert (
        status_after(("tool_start", {"call_id": "a", "name": "calculator", "input": {}}))
        == "Using calculator…"
    )
    assert status_after(("tool_end", {"call_id": "a", "name": "calculator"})) == "Thinking…"
    # What a run closes after it ended never brings a status back.
    assert (
        status_after(
            ("complete", {"input_tokens": 1, "output_tokens": 1}),
            ("tool_end", {"call_id": "a", "name": "calculator", "status": "failed"}),
        )
        == ""
    )
    assert "Step" not in fragments.fragments_for_events(
        _events(("iteration_start", {"iteration": 1, "max_iterations": 12})), "c1"
    )


# --- write_file approval ------------------------------------------------------------------------


def test_write_file_approval_shows_the_file_name_and_its_content_highlighted():
    content = 'def hello():\n    return "hi"\n'
    call = display.CallState("call-1", "write_file", "")
    call.apply(
        "approval_required",
        {"call_id": "call-1", "name": "write_file", "input": {"path": "hi.py", "content": content}},
    )
    html = fragments._oob("chat/_call_approval.html", call=call, chat_id="c1")
    assert "File <code>hi.py</code>" in html
    assert 'data-lang="python"' in html
    assert '<span class="k">def</span>' in html  # highlighted
    shown = html[: html.index('<details class="raw-args">')]  # the raw JSON is folded away
    assert "\\n" not in shown  # no JSON string with escaped newlines in sight
    assert "Approve" in html and "Deny" in html


def test_other_tools_keep_their_arguments():
    call = display.CallState("call-2", "calculator", "")
    call.apply(
        "approval_required",
        {"call_id": "call-2", "name": "calculator", "input": {"expression": "1+1"}},
    )
    assert call.file_preview is None
    html = fragments._oob("chat/_call_approval.html", call=call, chat_id="c1")
    assert "&quot;expression&quot;: &quot;1+1&quot;" in html


# --- exports --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_markdown_export_speakers_cannot_be_mistaken_for_a_replys_headings(alice, agent):
    chat = actions.new_chat(alice, title="Headings")
    reply = "# Plan\n\n## You\n\nsome text\n\n```md\n## kept in code\n```\n"
    store.append_display(chat.pk, [msg_event(user("hi"), 1), msg_event(assistant(reply), 2)])
    body = exports.as_markdown(chat, store.display_events_after(chat.pk, 0), with_reasoning=False)
    level2 = [line for line in body.splitlines() if line.startswith("## ")]
    # The speakers, and a line inside a code block (code is left as it is).
    assert level2 == ["## You", "## Assistant", "## kept in code"]
    assert "### Plan" in body and "#### You" in body
    assert [line for line in body.splitlines() if line.startswith("# ")] == ["# Headings"]


@pytest.mark.django_db
def test_export_file_names_differ_by_format(alice_client, alice, agent):
    chat = actions.new_chat(alice, title="Names")
    names = set()
    for fmt, query in [("md", ""), ("json", ""), ("json", "?reasoning=1")]:
        response = alice_client.get(reverse("chat_export", args=[chat.pk, fmt]) + query)
        names.add(response["Content-Disposition"])
    assert names == {
        'attachment; filename="names.md"',
        'attachment; filename="names.json"',
        'attachment; filename="names-with-thinking.json"',
    }


# --- API keys -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_creating_a_key_redirects_so_a_refresh_never_makes_a_second(alice_client, alice):
    url = reverse("api_keys")
    response = alice_client.post(url, {"name": "notebook"})
    assert response.status_code == 302 and response["Location"] == url
    shown = alice_client.get(url).content.decode()
    assert 'id="new-key-value"' in shown and "Copy the new key" in shown
    # A refresh: the same GET again (the browser never re-posts).
    again = alice_client.get(url).content.decode()
    assert 'id="new-key-value"' not in again
    assert ApiKey.objects.filter(user=alice).count() == 1
