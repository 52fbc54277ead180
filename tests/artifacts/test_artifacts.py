"""Artifacts on the Django side: versions from tools, code blocks and attachments; access;
downloads, preview, zip; the API; deleting a chat takes its files."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
import zipfile

import pytest
from channels.db import database_sync_to_async
from django.core.files.storage import default_storage
from django.test import Client

from chat import actions, artifacts, store
from chat.agent.workspace import WorkspaceError
from chat.apikeys import create_api_key
from chat.models import Artifact, ArtifactVersion, ChatToolGrant, QueuedInput
from chat.runhost import executor
from chat.runhost.workspace import ArtifactWorkspace

PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00"
    b"\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\xff\xff?\x00\x05\xfe\x02\xfe\xa7"
    b"\x35\x81\x84\x00\x00\x00\x00IEND\xaeB`\x82"
)
HTML = b"<!doctype html><html><body><script>parent.document.title='x'</script></body></html>"


def card_events(chat_id) -> list[dict]:
    return [e.payload for e in store.display_events_after(chat_id, 0) if e.kind == "artifact"]


# --- the workspace is the chat's artifacts --------------------------------------------------


@pytest.mark.django_db
def test_writes_and_edits_are_versions_each_with_a_card(alice):
    chat = actions.new_chat(alice)
    files = ArtifactWorkspace(chat.pk)
    assert files.list() == []
    first = files.write("notes.md", "# Notes\n\nStatus: draft\n")
    assert (first.path, first.created) == ("notes.md", True)
    again = files.write("./notes.md", "# Notes\n\nStatus: draft\n")  # same content: nothing new
    assert again.created is False
    edited = files.edit("notes.md", "draft", "final")
    assert edited.bytes_written == len("# Notes\n\nStatus: final\n")
    assert files.read("notes.md") == "# Notes\n\nStatus: final\n"
    files.write("src/app.py", "print(1)\n")
    assert [(e.path, e.size) for e in files.list()] == [("notes.md", 23), ("src/app.py", 9)]

    notes = Artifact.objects.get(chat=chat, path="notes.md")
    assert (notes.version_count, notes.kind, notes.source) == (2, "markdown", "file")
    v1, v2 = notes.versions.all()
    assert v1.sha256 != v2.sha256 and v2.size == 23
    assert default_storage.open(v1.storage_name).read() == b"# Notes\n\nStatus: draft\n"
    assert str(chat.pk) in v1.storage_name and "notes" not in v1.storage_name  # server-made
    cards = card_events(chat.pk)
    assert [(c["path"], c["version"]) for c in cards] == [
        ("notes.md", 1),
        ("notes.md", 2),
        ("src/app.py", 1),
    ]
    assert [v.seq for v in (v1, v2)] == [
        e.seq for e in store.display_events_after(chat.pk, 0) if e.kind == "artifact"
    ][:2]


@pytest.mark.django_db
def test_workspace_errors_are_worded_for_the_model(alice, settings):
    chat = actions.new_chat(alice)
    files = ArtifactWorkspace(chat.pk)
    with pytest.raises(WorkspaceError, match="does not exist. The workspace is empty"):
        files.read("nope.md")
    with pytest.raises(WorkspaceError, match=r"'\.\.' is not allowed"):
        files.write("../escape.md", "x")
    settings.LYCEUM_ARTIFACT_MAX_BYTES = 1024
    with pytest.raises(WorkspaceError, match="the limit is 1.0 KB per file"):
        files.write("big.txt", "x" * 2000)
    settings.LYCEUM_ARTIFACT_MAX_COUNT = 1
    files.write("one.txt", "1")
    with pytest.raises(WorkspaceError, match="already holds 1 files"):
        files.write("two.txt", "2")
    files.write("bin.dat", "ok") if False else None
    artifacts.save_version(chat.pk, "one.txt", b"\x00\x01", source="file", card=False)
    with pytest.raises(WorkspaceError, match="not a UTF-8 text file|NUL"):
        files.read("one.txt")
    assert Artifact.objects.filter(chat=chat).count() == 1


@pytest.mark.django_db
def test_code_blocks_of_a_written_reply(alice):
    chat = actions.new_chat(alice)
    five = "".join(f"x{i} = {i}\n" for i in range(5))
    text = (
        f"```python\n{five}```\nShort one:\n```sh\nls\n```\n"
        "```js title=app.js\nconsole.log(1)\n```\n"
        f"Same again:\n```python\n{five}```\n"
    )
    rows = artifacts.save_code_blocks(chat.pk, text, seq=7)
    assert sorted(r.payload["path"] for r in rows) == ["app.js", "snippet-7-1.py"]
    # The same reply written again keeps nothing new (same content, same names).
    assert artifacts.save_code_blocks(chat.pk, text, seq=9) == []
    app = Artifact.objects.get(chat=chat, path="app.js")
    assert (app.kind, app.language, app.source) == ("code", "javascript", "code")


# --- a run: the demo model writes, edits and answers with code -------------------------------


@pytest.fixture
async def runs(settings, transactional_db):
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.05
    yield
    await executor.stop_all()


async def _settle() -> None:
    async with asyncio.timeout(20):
        while executor._tasks:
            await asyncio.gather(*list(executor._tasks.values()), return_exceptions=True)
            await asyncio.sleep(0)


async def test_a_run_writes_versions_through_its_tools_and_keeps_code_blocks(alice, agent, runs):
    adb = database_sync_to_async
    chat = await adb(actions.new_chat)(alice, model="demo-fast")
    await adb(ChatToolGrant.objects.create)(chat=chat, tool_name="write_file")
    await adb(ChatToolGrant.objects.create)(chat=chat, tool_name="edit_file")
    for text in ("write file notes.md", "edit file notes.md", "show me some code"):
        await adb(actions.send_message)(alice, chat.pk, text, uuid.uuid4().hex)
        await _settle()

    def check() -> None:
        notes = Artifact.objects.get(chat=chat, path="notes.md")
        assert notes.version_count == 2
        assert "Status: final" in (artifacts.read_text(notes.versions.get(number=2)) or "")
        code = Artifact.objects.get(chat=chat, source="code")
        assert code.path.startswith("snippet-") and code.path.endswith("-1.py")
        assert code.language == "python"
        cards = card_events(chat.pk)
        assert [(c["path"], c["version"]) for c in cards] == [
            ("notes.md", 1),
            ("notes.md", 2),
            (code.path, 1),
        ]
        # Each card comes between its tool call's start and end.
        kinds = [(e.kind, e.payload.get("name")) for e in store.display_events_after(chat.pk, 0)]
        start = kinds.index(("tool_start", "write_file"))
        assert kinds[start + 1][0] == "artifact"

    await adb(check)()


# --- access: another chat's artifact is 404 everywhere ---------------------------------------


@pytest.fixture
def alices_file(alice):
    chat = actions.new_chat(alice)
    files = ArtifactWorkspace(chat.pk)
    files.write("page.html", HTML.decode())
    files.write("notes.md", "# v1\n")
    files.write("notes.md", "# v2\n")
    return chat, Artifact.objects.get(chat=chat, path="page.html")


@pytest.mark.django_db(transaction=True)
def test_another_users_artifact_is_404_on_every_route(alices_file, bob, client):
    chat, page = alices_file
    client.force_login(bob)
    urls = [
        f"/artifacts/{page.pk}/",
        f"/artifacts/{page.pk}/v1/download",
        f"/artifacts/{page.pk}/v1/preview",
        f"/artifacts/{page.pk}/v1/raw",
        f"/chat/{chat.pk}/artifacts/",
        f"/chat/{chat.pk}/artifacts.zip",
        f"/artifacts/{uuid.uuid4()}/",
    ]
    for url in urls:
        assert client.get(url).status_code == 404, url
    upload = client.post(f"/chat/{chat.pk}/attachments/", {"file": io.BytesIO(b"hi")})
    assert upload.status_code == 404
    anonymous = Client()
    assert anonymous.get(f"/artifacts/{page.pk}/").status_code == 302  # to the login page

    _key, raw = create_api_key(bob)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for url in (
        f"/api/v1/chat/{chat.pk}/artifacts",
        f"/api/v1/artifacts/{page.pk}",
        f"/api/v1/artifacts/{page.pk}/versions/1/download",
    ):
        response = api.get(url)
        assert response.status_code == 404, url
        assert response.json()["error"]["type"] == "not_found"


@pytest.mark.django_db
def test_downloads_are_attachments_of_a_server_chosen_type(alices_file, alice_client):
    _chat, page = alices_file
    response = alice_client.get(f"/artifacts/{page.pk}/v1/download")
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="page.html"'
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Security-Policy"].startswith("sandbox")
    assert b"".join(response.streaming_content) == HTML
    assert alice_client.get(f"/artifacts/{page.pk}/v9/download").status_code == 404
    # HTML is never served inline as an image, nor text previewed.
    assert alice_client.get(f"/artifacts/{page.pk}/v1/raw").status_code == 404
    notes = Artifact.objects.get(path="notes.md")
    assert alice_client.get(f"/artifacts/{notes.pk}/v1/preview").status_code == 404


@pytest.mark.django_db
def test_odd_names_download_under_safe_ones(alice, alice_client):
    chat = actions.new_chat(alice)
    artifacts.save_version(
        chat.pk, 'evil"\r\nX-Bad: 1/..\\run.sh', b"echo hi\n", source="attachment", card=False
    )
    artifact = Artifact.objects.get(chat=chat)
    response = alice_client.get(f"/artifacts/{artifact.pk}/v1/download")
    assert "\n" not in response["Content-Disposition"]
    assert response["Content-Disposition"] == 'attachment; filename="run.sh"'
    assert response["Content-Type"] == "text/plain; charset=utf-8"


@pytest.mark.django_db
def test_the_preview_is_a_sandboxed_document(alices_file, alice_client):
    _chat, page = alices_file
    response = alice_client.get(f"/artifacts/{page.pk}/v1/preview")
    assert response.status_code == 200
    csp = response["Content-Security-Policy"]
    assert csp.startswith("sandbox allow-scripts;") and "allow-same-origin" not in csp
    assert "frame-ancestors 'self'" in csp and "default-src 'none'" in csp
    assert response["X-Frame-Options"] == "SAMEORIGIN"
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    detail = alice_client.get(f"/artifacts/{page.pk}/").content.decode()
    assert '<iframe title="Preview"' in detail and 'sandbox="allow-scripts"' in detail
    assert "allow-same-origin" not in detail


@pytest.mark.django_db
def test_the_artifact_page_highlights_and_diffs(alices_file, alice_client):
    chat, _page = alices_file
    notes = Artifact.objects.get(chat=chat, path="notes.md")
    html = alice_client.get(f"/artifacts/{notes.pk}/").content.decode()
    assert "Version 2 of 2" in html and "<h1>v2</h1>" in html  # rendered markdown
    diff = alice_client.get(f"/artifacts/{notes.pk}/?v=2&diff=1").content.decode()
    assert "Changes from version 1 to version 2" in diff
    assert "-# v1" in diff.replace('<span class="gd">', "").replace("</span>", "")
    app = ArtifactWorkspace(chat.pk)
    app.write("app.py", "def f():\n    return 1\n")
    code = Artifact.objects.get(chat=chat, path="app.py")
    page = alice_client.get(f"/artifacts/{code.pk}/").content.decode()
    assert '<span class="k">def</span>' in page  # Pygments


@pytest.mark.django_db
def test_the_zip_holds_the_latest_version_of_each_file(alices_file, alice_client):
    chat, _page = alices_file
    artifacts.save_version(chat.pk, "src/../../x.py", b"print(2)\n", source="code", card=False)
    response = alice_client.get(f"/chat/{chat.pk}/artifacts.zip")
    assert response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"].startswith("attachment;")
    body = b"".join(response.streaming_content)
    archive = zipfile.ZipFile(io.BytesIO(body))
    assert sorted(archive.namelist()) == ["notes.md", "page.html", "src/x.py"]
    assert archive.read("notes.md") == b"# v2\n"
    assert archive.testzip() is None


@pytest.mark.django_db
def test_the_panel_and_the_page(alices_file, alice_client):
    chat, page = alices_file
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    assert 'role="region" aria-label="Artifacts"' in html
    assert f'href="/artifacts/{page.pk}/"' in html and "Download all" in html
    assert "2 versions" in html
    assert "Attach" in html


# --- attachments ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_attached_text_goes_into_context_and_images_to_a_model_that_takes_them(
    alice, alice_client, settings
):
    settings.LYCEUM_ATTACHMENT_CONTEXT_CHARS = 100
    chat = actions.new_chat(alice, model="demo")
    text = alice_client.post(
        f"/chat/{chat.pk}/attachments/",
        {"file": _upload("data.csv", b"a,b\n" + b"1,2\n" * 100)},
    )
    assert text.status_code == 201, text.content
    image = alice_client.post(f"/chat/{chat.pk}/attachments/", {"file": _upload("dot.png", PNG)})
    blob = alice_client.post(
        f"/chat/{chat.pk}/attachments/", {"file": _upload("blob.bin", b"\x00\x01")}
    )
    ids = [text.json()["id"], image.json()["id"], blob.json()["id"]]
    assert image.json()["kind"] == "image"
    sent = actions.send_message(alice, chat.pk, "look at these", "c1", attachments=ids)
    queued = QueuedInput.objects.get(pk=sent.input_id)
    assert queued.content.startswith("look at these")
    assert "Attached file data.csv:" in queued.content
    assert "[Cut: only the first 100 of 404 characters" in queued.content
    assert "[Attached image: dot.png]" in queued.content
    assert "blob.bin, 2 bytes, a binary file" in queued.content
    assert queued.images == [ids[1]]
    (image_input,) = artifacts.images_for_model(queued.images)
    assert image_input.media_type == "image/png"
    (message,) = [e for e in store.display_events_after(chat.pk, 0) if e.kind == "msg"]
    assert message.payload["content"] == "look at these"
    shown = message.payload["extra"]["attachments"]
    assert [a["path"] for a in shown] == ["data.csv", "dot.png", "blob.bin"]
    assert ArtifactVersion.objects.get(pk=ids[0]).seq == message.seq
    page = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    assert f"/artifacts/{image.json()['artifact_id']}/v1/raw" in page
    raw = alice_client.get(f"/artifacts/{image.json()['artifact_id']}/v1/raw")
    assert raw["Content-Type"] == "image/png" and raw["X-Content-Type-Options"] == "nosniff"


@pytest.mark.django_db
def test_attachment_refusals_are_clear(alice, alice_client, bob, settings):
    from chat.models import Provider, ProviderModel

    provider = Provider.objects.create(name="p", kind="openai", base_url="http://127.0.0.1:9")
    ProviderModel.objects.create(provider=provider, alias="text-only", model_id="t")
    chat = actions.new_chat(alice, model="text-only")
    image = actions.attach_file(alice, chat.pk, "dot.png", PNG)
    with pytest.raises(actions.ActionError, match="cannot read images"):
        actions.send_message(alice, chat.pk, "see", "c1", attachments=[str(image.pk)])
    other = actions.new_chat(bob)
    theirs = actions.attach_file(bob, other.pk, "x.txt", b"x")
    with pytest.raises(actions.ActionError, match="gone"):
        actions.send_message(alice, chat.pk, "see", "c2", attachments=[str(theirs.pk)])
    settings.LYCEUM_ATTACHMENT_KINDS = ["text", "code", "markdown"]
    refused = alice_client.post(
        f"/chat/{chat.pk}/attachments/", {"file": _upload("a.pdf", b"%PDF-1.4")}
    )
    assert refused.status_code == 400
    assert (
        "a.pdf is a PDF; files you can attach here: text, code, markdown."
        in refused.json()["error"]
    )
    settings.LYCEUM_ARTIFACT_MAX_BYTES = 1024
    big = alice_client.post(
        f"/chat/{chat.pk}/attachments/", {"file": _upload("b.txt", b"x" * 2048)}
    )
    assert big.status_code == 413 and "limit is 1.0 KB per file" in big.json()["error"]


def _upload(name: str, data: bytes):
    handle = io.BytesIO(data)
    handle.name = name
    return handle


# --- the API ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_api_lists_shows_downloads_and_uploads(alices_file, alice):
    chat, page = alices_file
    _key, raw = create_api_key(alice)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    listed = api.get(f"/api/v1/chat/{chat.pk}/artifacts").json()
    assert [a["path"] for a in listed["artifacts"]] == ["notes.md", "page.html"]
    one = api.get(f"/api/v1/artifacts/{page.pk}").json()
    assert one["kind"] == "html" and one["version_list"][0]["content_type"].startswith("text/html")
    download = api.get(one["version_list"][0]["download_url"])
    assert download.content == HTML
    assert download["Content-Disposition"] == 'attachment; filename="page.html"'
    assert download["X-Content-Type-Options"] == "nosniff"
    uploaded = api.post(f"/api/v1/chat/{chat.pk}/attachments", {"file": _upload("n.txt", b"hello")})
    assert uploaded.status_code == 201
    body = uploaded.json()
    assert (body["path"], body["kind"], body["size"]) == ("n.txt", "text", 5)
    assert api.post(f"/api/v1/chat/{chat.pk}/attachments", {}).status_code == 400
    bad = api.post(
        "/api/v1/chat",
        json.dumps({"message": "hi", "session_id": str(chat.pk), "attachments": [1]}),
        content_type="application/json",
    )
    assert bad.status_code == 400


# --- deleting a chat deletes its files -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_deleting_a_chat_deletes_its_artifacts_and_their_content(alice):
    chat = actions.new_chat(alice)
    files = ArtifactWorkspace(chat.pk)
    files.write("a.txt", "a")
    files.write("a.txt", "b")
    names = artifacts.storage_names(chat.pk)
    assert len(names) == 2 and all(default_storage.exists(n) for n in names)
    actions.delete_chat(alice, chat.pk)
    assert not Artifact.objects.exists() and not ArtifactVersion.objects.exists()
    assert not any(default_storage.exists(n) for n in names)
