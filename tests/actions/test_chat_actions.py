"""Actions own their effects: what a caller gets without doing anything more."""

from __future__ import annotations

import pytest
from django.http import Http404

from chat import actions
from chat.models import ChatEvent, ChatSession, Run

pytestmark = [pytest.mark.django_db]


def test_deleting_a_chat_removes_its_log_runs_and_workspace_files(
    alice, agent, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_RUNNER = "worker"  # nothing executes the run here
    chat = actions.new_chat(alice, model="demo-fast")
    with django_capture_on_commit_callbacks(execute=False):
        actions.send_message(alice, chat.pk, "hello", "c-1")
    files = settings.LYCEUM_WORKSPACE_ROOT / str(chat.pk)
    files.mkdir(parents=True)
    (files / "notes.md").write_text("kept until the chat goes")
    other = actions.new_chat(alice, model="demo-fast")
    (settings.LYCEUM_WORKSPACE_ROOT / str(other.pk)).mkdir()

    with django_capture_on_commit_callbacks(execute=True):
        title = actions.delete_chat(alice, chat.pk)

    assert title == "hello"
    assert not ChatSession.objects.filter(pk=chat.pk).exists()
    assert not ChatEvent.objects.filter(chat_id=chat.pk).exists()
    assert not Run.objects.filter(chat_id=chat.pk).exists()
    assert not files.exists()
    assert (settings.LYCEUM_WORKSPACE_ROOT / str(other.pk)).exists()


def test_only_the_owner_deletes(alice, bob, agent):
    chat = actions.new_chat(alice, model="demo-fast")
    with pytest.raises(Http404):
        actions.delete_chat(bob, chat.pk)
    assert ChatSession.objects.filter(pk=chat.pk).exists()


def test_a_refused_first_message_leaves_no_empty_chat(alice, agent):
    with pytest.raises(actions.ActionError):
        actions.start_chat_and_send(alice, "x" * (actions.MAX_MESSAGE_CHARS + 1), "c-1")
    with pytest.raises(actions.ActionError):
        actions.start_chat_and_send(alice, "hello", "c-2", model="no-such-model")
    assert not ChatSession.objects.filter(owner=alice).exists()


def test_a_send_launches_its_run_after_the_commit(
    alice, agent, settings, monkeypatch, django_capture_on_commit_callbacks
):
    launched: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        "chat.runhost.executor.launch_soon",
        lambda run_id, *, resume=False: launched.append((run_id, resume)),
    )
    chat = actions.new_chat(alice, model="demo-fast")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        sent = actions.send_message(alice, chat.pk, "hello", "c-1")
    assert launched == []  # nothing before the commit
    for callback in callbacks:
        callback()
    assert launched == [(sent.run_id, False)]
    # A second message while the run is live is queued: no second run.
    with django_capture_on_commit_callbacks(execute=True):
        queued = actions.send_message(alice, chat.pk, "and this", "c-2")
    assert queued.queued and queued.run_id is None
    assert launched == [(sent.run_id, False)]
