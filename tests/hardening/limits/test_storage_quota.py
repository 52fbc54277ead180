"""§4 of issue 14: a storage quota per user over all their chats' files.

Uploads get a 413 with words; a tool's write gets an error the model reads; a reply's code
block is skipped without undoing the reply. Nothing half-written: no row, no stored file.
Marked ``persistence``.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.test import Client

from chat import actions, apikeys, artifacts, quotas
from chat.agent.workspace import WorkspaceError
from chat.models import Artifact, ArtifactVersion, ChatSession
from chat.runhost.workspace import ArtifactWorkspace

pytestmark = [pytest.mark.persistence]

KB = 1024
OVER = "over your storage quota of 1 MB. Delete chats or files you no longer need."


@pytest.fixture
def quota(settings):
    settings.LYCEUM_STORAGE_QUOTA_MB = 1
    return settings


def stored_files(chat: ChatSession) -> set[str]:
    folder = Path(django_settings.MEDIA_ROOT) / "artifacts" / str(chat.pk)
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


def text(size: int, mark: str = "a") -> str:
    return (mark * 63 + "\n") * (size // 64)


@pytest.mark.django_db
def test_a_tool_write_over_the_quota_is_an_error_the_model_reads(alice, agent, quota):
    first, second = actions.new_chat(alice), actions.new_chat(alice)
    ArtifactWorkspace(first.pk).write("big.txt", text(700 * KB))
    before = stored_files(second)

    with pytest.raises(WorkspaceError) as refused:
        ArtifactWorkspace(second.pk).write("more.txt", text(400 * KB))

    assert OVER in str(refused.value)
    assert "Your files would take 1.1 MB" in str(refused.value)
    assert not Artifact.objects.filter(chat=second).exists()
    assert stored_files(second) == before  # the content written first was removed
    # A small file still fits.
    ArtifactWorkspace(second.pk).write("small.txt", text(100 * KB))


@pytest.mark.django_db
def test_every_version_counts_and_deleting_a_chat_frees_its_share(alice, agent, quota):
    chat = actions.new_chat(alice)
    files = ArtifactWorkspace(chat.pk)
    files.write("notes.txt", text(400 * KB, "a"))
    files.write("notes.txt", text(400 * KB, "b"))
    with pytest.raises(WorkspaceError):
        files.write("notes.txt", text(400 * KB, "c"))
    assert quotas.storage_used(alice.pk) == 800 * KB

    actions.delete_chat(alice, chat.pk)

    ArtifactWorkspace(actions.new_chat(alice).pk).write("notes.txt", text(900 * KB))


@pytest.mark.django_db(transaction=True)
def test_an_upload_over_the_quota_is_a_413_with_words_on_the_page_and_the_api(
    alice, bob, agent, quota
):
    chat = actions.new_chat(alice)
    actions.attach_file(alice, chat.pk, "one.txt", text(900 * KB).encode())
    page = Client()
    page.force_login(alice)

    response = page.post(
        f"/chat/{chat.pk}/attachments/", {"file": io.BytesIO(text(200 * KB).encode())}
    )

    assert response.status_code == 413
    assert OVER in response.json()["error"]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {apikeys.create_api_key(alice)[1]}")
    upload = io.BytesIO(text(200 * KB).encode())
    upload.name = "two.txt"
    answer = api.post(f"/api/v1/chat/{chat.pk}/attachments", {"file": upload})
    assert answer.status_code == 413 and OVER in answer.json()["error"]["message"]
    assert ArtifactVersion.objects.filter(artifact__chat=chat).count() == 1
    assert len(stored_files(chat)) == 1
    # Bob, with nothing stored, uploads the same file.
    bobs = actions.new_chat(bob)
    actions.attach_file(bob, bobs.pk, "two.txt", text(200 * KB).encode())


@pytest.mark.django_db
def test_a_code_block_over_the_quota_is_skipped_and_the_reply_still_commits(alice, agent, quota):
    chat = actions.new_chat(alice)
    ArtifactWorkspace(chat.pk).write("big.txt", text(1000 * KB))
    reply = "Here:\n\n```python\n" + "print('hello world')\n" * 2000 + "```\n"

    with transaction.atomic():
        rows = artifacts.save_code_blocks(chat.pk, reply, seq=5)
        # The transaction is still usable: a refused block does not doom the reply's commit.
        ChatSession.objects.filter(pk=chat.pk).update(title="after the block")

    assert rows == []
    assert ChatSession.objects.get(pk=chat.pk).title == "after the block"
    assert Artifact.objects.filter(chat=chat).count() == 1


@pytest.mark.django_db(transaction=True)
def test_eight_writes_at_once_keep_within_the_quota(alice, agent, quota):
    chats = [actions.new_chat(alice) for _ in range(8)]

    def write(n: int) -> bool:
        try:
            ArtifactWorkspace(chats[n].pk).write("part.txt", text(300 * KB, str(n)))
            return True
        except WorkspaceError:
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        written = list(pool.map(write, range(8)))

    assert written.count(True) == 3  # 900 KB fit in 1 MB, a fourth would not
    assert quotas.storage_used(alice.pk) == 900 * KB
    assert sum(len(stored_files(chat)) for chat in chats) == 3
