"""The agent's workspace on the Django side: the chat's artifacts.

``read_file`` and ``list_files`` see the latest versions; ``write_file`` and
``edit_file`` write new versions, each shown as a card in the transcript and in the
artifacts panel, live. So a run on a worker and a page on a web process see the same
files, and deleting the chat deletes them.

Tools run in a worker thread (``chat.agent.registry``). Content goes to storage in
that thread; the database is reached through ``database_sync_to_async`` on the run's
event loop (the process's database thread), as everything else the run writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction

from chat import artifacts
from chat.agent.workspace import (
    EditResult,
    FileEntry,
    WorkspaceError,
    WriteResult,
    decode_text,
    normalize_path,
    replace_once,
)
from chat.live.doorbell import ring
from chat.models import Artifact

T = TypeVar("T")


class ArtifactWorkspace:
    """The files of one chat, as artifacts (implements ``WorkspaceFiles``)."""

    def __init__(
        self, chat_id: Any, *, run_id: str = "", loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.chat_id = chat_id
        self.run_id = run_id
        self.loop = loop

    def __repr__(self) -> str:
        return f"ArtifactWorkspace({str(self.chat_id)!r})"

    def _db(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn`` on the database thread when a loop is known (tools' worker thread)."""
        loop = self.loop
        if loop is None or not loop.is_running() or _on_loop_thread(loop):
            return fn(*args)
        future = asyncio.run_coroutine_threadsafe(database_sync_to_async(fn)(*args), loop)
        return future.result()

    # --- WorkspaceFiles ---------------------------------------------------------------------

    def read(self, path: str) -> str:
        norm = normalize_path(path)
        version = self._db(artifacts.latest_version, self.chat_id, norm)
        if version is None:
            raise WorkspaceError(f"File {path!r} does not exist. {self._names_hint()}")
        limit = settings.LYCEUM_ARTIFACT_MAX_BYTES
        if version.size > limit:
            raise WorkspaceError(f"{path!r} is {version.size} bytes, larger than {limit} bytes.")
        return decode_text(path, artifacts.read_bytes(version))

    def write(self, path: str, content: str) -> WriteResult:
        if not isinstance(content, str):
            raise WorkspaceError("File content must be text.")
        norm = normalize_path(path)
        data = content.encode("utf-8")
        try:
            artifacts.check_size(len(data), norm)
        except artifacts.ArtifactError as exc:
            raise WorkspaceError(exc.message) from None
        name = artifacts.store_content(self.chat_id, data)  # file I/O here, not on the db thread
        try:
            created = self._db(self._commit_write, norm, data, name)
        except BaseException:
            artifacts.forget_content([name])
            raise
        return WriteResult(path=norm, bytes_written=len(data), created=created)

    def _commit_write(self, path: str, data: bytes, storage_name: str) -> bool:
        with transaction.atomic():
            exists = Artifact.objects.filter(chat_id=self.chat_id, path=path).exists()
            try:
                saved = artifacts.save_version(
                    self.chat_id,
                    path,
                    data,
                    source=Artifact.Source.FILE,
                    storage_name=storage_name,
                    run_id=self.run_id,
                )
            except artifacts.ArtifactError as exc:
                raise WorkspaceError(exc.message) from None
            if saved is not None:
                ring(self.chat_id, saved.rows)
        return not exists

    def edit(self, path: str, old: str, new: str) -> EditResult:
        text = self.read(path)
        result = self.write(path, replace_once(text, path, old, new))
        return EditResult(path=result.path, bytes_written=result.bytes_written)

    def list(self) -> list[FileEntry]:
        return self._db(_entries, self.chat_id)

    def _names_hint(self, limit: int = 20) -> str:
        names = [entry.path for entry in self.list()]
        if not names:
            return "The workspace is empty."
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        return f"Existing files: {', '.join(names[:limit])}{more}."


def _entries(chat_id: Any) -> list[FileEntry]:
    return [FileEntry(v.artifact.path, v.size) for v in artifacts.latest_versions(chat_id)]


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
