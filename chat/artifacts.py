"""The artifact store: the only code that writes artifacts and their versions.

An artifact is a named file of one chat with versions (``chat.models.Artifact``).
Content goes through Django's storage API under server-made names
(``artifacts/<chat id>/<random hex>``), so any storage backend works and a name from
a model or an upload never reaches a file system. Kind and language are detected
from the content (``chat.core.artifacts``).

:func:`save_version` writes a version inside the caller's transaction and, unless
told otherwise, appends the display event that shows its card (kind ``artifact``);
the caller rings the doorbell for the rows it returns, after the commit, like every
writer of events. Reading: :func:`latest_versions`, :func:`read_bytes`,
:func:`panel`, and :func:`zip_stream` for a whole chat as a zip, streamed.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, default_storage
from django.db import transaction
from django.db.models import F, Sum
from django.utils.translation import gettext as _

from chat import quotas, store
from chat.agent.events import ArtifactSaved
from chat.agent.workspace import WorkspaceError, normalize_path
from chat.core.artifacts import TEXT_KINDS, Kind, detect_kind, safe_path
from chat.core.artifacts import CodeBlock as CodeBlock
from chat.core.artifacts import extract_code_blocks as extract_code_blocks
from chat.core.messages import Image
from chat.models import Artifact, ArtifactVersion, ChatEvent

logger = logging.getLogger(__name__)

PANEL_LIMIT = 20  # the panel's newest artifacts; the list page has them all
ZIP_CHUNK = 256 * 1024


class ArtifactError(Exception):
    """A file that cannot be stored (too large, too many, a refused type), worded for people."""

    def __init__(self, message: str, code: str = "refused") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True)
class Saved:
    artifact: Artifact
    version: ArtifactVersion
    rows: list[ChatEvent]  # the card's display event (ring for it after the commit)

    @property
    def created(self) -> bool:
        return self.version.number == 1


def storage() -> Storage:
    return default_storage


def store_content(chat_id: Any, data: bytes) -> str:
    """Put ``data`` in storage under a new server-made name; the name."""
    return storage().save(f"artifacts/{chat_id}/{uuid.uuid4().hex}", ContentFile(data))


def forget_content(names: list[str]) -> None:
    for name in names:
        try:
            storage().delete(name)
        except OSError:
            logger.warning("could not delete artifact content %s", name, exc_info=True)


def check_size(size: int, name: str) -> None:
    limit = settings.LYCEUM_ARTIFACT_MAX_BYTES
    if size > limit:
        raise ArtifactError(
            _("%(name)s is %(size)s; the limit is %(limit)s per file.")
            % {"name": name, "size": human_size(size), "limit": human_size(limit)},
            "too_large",
        )


def _check_chat_limits(chat_id: Any, size: int, new_artifact: bool) -> None:
    if new_artifact:
        count = Artifact.objects.filter(chat_id=chat_id).count()
        if count >= settings.LYCEUM_ARTIFACT_MAX_COUNT:
            raise ArtifactError(
                _(
                    "This chat already holds %(count)s files, the maximum. "
                    "Replace or edit an existing file instead."
                )
                % {"count": count},
                "too_many",
            )
    used = (
        ArtifactVersion.objects.filter(artifact__chat_id=chat_id).aggregate(total=Sum("size"))[
            "total"
        ]
        or 0
    )
    limit = settings.LYCEUM_ARTIFACT_CHAT_MAX_BYTES
    if used + size > limit:
        raise ArtifactError(
            _("This chat's files would take %(size)s; the limit is %(limit)s per chat.")
            % {"size": human_size(used + size), "limit": human_size(limit)},
            "chat_full",
        )
    try:
        quotas.check_storage(chat_id, size)
    except quotas.OverLimit as exc:
        raise ArtifactError(exc.message, exc.code) from None


def save_version(
    chat_id: Any,
    path: str,
    data: bytes,
    *,
    source: str,
    language_hint: str = "",
    storage_name: str | None = None,
    card: bool = True,
    run_id: str = "",
) -> Saved | None:
    """A new version of ``path`` in the chat (inside the caller's transaction).

    None when ``data`` is the latest version's content already (nothing new). With
    ``storage_name`` the content is in storage already (written outside the
    transaction); otherwise it is stored here. ``path`` must be checked already
    (``chat.agent.workspace.normalize_path``).
    """
    check_size(len(data), path)
    sha = hashlib.sha256(data).hexdigest()
    refused: ArtifactError | None = None
    with transaction.atomic(savepoint=False):
        artifact = Artifact.objects.select_for_update().filter(chat_id=chat_id, path=path).first()
        if artifact is not None:
            latest = artifact.versions.filter(number=artifact.version_count).first()
            if latest is not None and latest.sha256 == sha:
                if storage_name:
                    transaction.on_commit(lambda: forget_content([storage_name]))
                return None
        try:
            _check_chat_limits(chat_id, len(data), artifact is None)
        except ArtifactError as exc:
            # Raised out of this block it would doom the caller's whole transaction (no
            # savepoint here): a reply's code block over a limit must not undo the reply.
            refused = exc
        if refused is None:
            return _write_version(
                chat_id,
                path,
                data,
                sha,
                artifact,
                source,
                language_hint,
                storage_name,
                card,
                run_id,
            )
    raise refused


def _write_version(
    chat_id: Any,
    path: str,
    data: bytes,
    sha: str,
    artifact: Artifact | None,
    source: str,
    language_hint: str,
    storage_name: str | None,
    card: bool,
    run_id: str,
) -> Saved:
    detected = detect_kind(path, data, language_hint=language_hint)
    name = storage_name or store_content(chat_id, data)
    if artifact is None:
        artifact = Artifact.objects.create(chat_id=chat_id, path=path, source=source)
    artifact.version_count += 1
    artifact.kind, artifact.language, artifact.size = (
        detected.kind.value,
        detected.language,
        len(data),
    )
    version = ArtifactVersion.objects.create(
        artifact=artifact,
        number=artifact.version_count,
        storage_name=name,
        size=len(data),
        sha256=sha,
        kind=detected.kind.value,
        language=detected.language,
        mime=detected.mime,
    )
    artifact.save(update_fields=["version_count", "kind", "language", "size", "updated_at"])
    rows: list[ChatEvent] = []
    if card:
        rows = store.append_display(chat_id, [card_payload(artifact, version, run_id)])
        version.seq = rows[0].seq
        version.save(update_fields=["seq"])
    return Saved(artifact, version, rows)


def card_payload(artifact: Artifact, version: ArtifactVersion, run_id: str = "") -> dict[str, Any]:
    """The display event of a version (a run's ``ArtifactSaved`` event when a run wrote it)."""
    event = ArtifactSaved(
        chat_id=str(artifact.chat_id),
        run_id=run_id,
        artifact_id=str(artifact.pk),
        version_id=str(version.pk),
        version=version.number,
        path=artifact.path,
        kind=version.kind,
        language=version.language,
        size=version.size,
        source=artifact.source,
    )
    payload = event.to_dict()
    payload.pop("seq", None)
    return payload


def save_code_blocks(chat_id: Any, text: str, seq: int, *, run_id: str = "") -> list[ChatEvent]:
    """Keep the substantial code blocks of a written reply (display ``seq``) as artifacts.

    A named block is a version of that file (nothing new when its content is the
    latest already); an unnamed one is ``snippet-<seq>-<n>.<ext>``, skipped when the
    chat holds that exact content already. Blocks refused by a limit are skipped.
    """
    rows: list[ChatEvent] = []
    for block in extract_code_blocks(text):
        data = block.content.encode("utf-8")
        path = None
        if block.name:
            try:
                path = normalize_path(block.name)
            except WorkspaceError:
                path = None
        if path is None:
            sha = hashlib.sha256(data).hexdigest()
            if ArtifactVersion.objects.filter(artifact__chat_id=chat_id, sha256=sha).exists():
                continue
            path = block.default_name(f"snippet-{seq}-{block.index + 1}")
        try:
            saved = save_version(
                chat_id,
                path,
                data,
                source=Artifact.Source.CODE,
                language_hint=block.language,
                run_id=run_id,
            )
        except ArtifactError as exc:
            logger.info("code block %s of chat %s not kept: %s", path, chat_id, exc.message)
            continue
        if saved is not None:
            rows += saved.rows
    return rows


# --- reading --------------------------------------------------------------------------------


def latest_version(chat_id: Any, path: str) -> ArtifactVersion | None:
    return (
        ArtifactVersion.objects.filter(
            artifact__chat_id=chat_id, artifact__path=path, number=F("artifact__version_count")
        )
        .select_related("artifact")
        .first()
    )


def latest_versions(chat_id: Any) -> list[ArtifactVersion]:
    """The newest version of every artifact of the chat, by path."""
    return list(
        ArtifactVersion.objects.filter(
            artifact__chat_id=chat_id, number=F("artifact__version_count")
        )
        .select_related("artifact")
        .order_by("artifact__path")
    )


def read_bytes(version: ArtifactVersion) -> bytes:
    with storage().open(version.storage_name, "rb") as handle:
        data: bytes = handle.read()
    return data


def read_text(version: ArtifactVersion) -> str | None:
    """The version's text, or None when it is not text."""
    if version.kind not in TEXT_KINDS:
        return None
    try:
        return read_bytes(version).decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class Panel:
    artifacts: list[Artifact]
    total: int

    @property
    def more(self) -> int:
        return self.total - len(self.artifacts)


def panel(chat_id: Any, limit: int = PANEL_LIMIT) -> Panel:
    """The newest artifacts of a chat for its panel, and how many there are."""
    rows = list(
        Artifact.objects.filter(chat_id=chat_id)
        .order_by("-updated_at", "-pk")
        .only("id", "path", "kind", "size", "version_count", "updated_at")[: limit + 1]
    )
    if len(rows) <= limit:
        return Panel(rows, len(rows))
    return Panel(rows[:limit], Artifact.objects.filter(chat_id=chat_id).count())


def storage_names(chat_id: Any) -> list[str]:
    return list(
        ArtifactVersion.objects.filter(artifact__chat_id=chat_id).values_list(
            "storage_name", flat=True
        )
    )


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            if unit == "bytes":
                return f"{int(value)} bytes"
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} bytes"


# --- the zip of a chat --------------------------------------------------------------------------


@dataclass(frozen=True)
class ZipEntry:
    arcname: str
    storage_name: str
    compress: bool
    modified: datetime


def zip_entries(chat_id: Any) -> list[ZipEntry]:
    """The latest version of every artifact, each under a safe, unique path in the zip."""
    entries: list[ZipEntry] = []
    taken: set[str] = set()
    for version in latest_versions(chat_id):
        arcname = safe_path(version.artifact.path)
        stem, dot, ext = arcname.rpartition(".")
        n = 2
        while arcname.lower() in taken:
            arcname = f"{stem} ({n}).{ext}" if dot else f"{ext} ({n})"
            n += 1
        taken.add(arcname.lower())
        entries.append(
            ZipEntry(
                arcname,
                version.storage_name,
                Kind(version.kind) in TEXT_KINDS,
                version.created_at,
            )
        )
    return entries


class _Sink:
    """A write-only, unseekable file for ``zipfile``: what it writes is taken in chunks."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._offset = 0

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        self._offset += len(data)
        return len(data)

    def tell(self) -> int:
        return self._offset

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


def zip_stream(entries: list[ZipEntry], chunk: int = ZIP_CHUNK) -> Iterator[bytes]:
    """The zip of ``entries``, made as it is sent: memory stays at about one chunk.

    The sink cannot seek, so ``zipfile`` writes each entry's sizes after its data
    (data descriptors) and nothing is held back for the central directory but names.
    """
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", allowZip64=True) as archive:  # type: ignore[call-overload]
        for entry in entries:
            info = zipfile.ZipInfo(entry.arcname, date_time=entry.modified.timetuple()[:6])
            info.compress_type = zipfile.ZIP_DEFLATED if entry.compress else zipfile.ZIP_STORED
            with (
                storage().open(entry.storage_name, "rb") as source,
                archive.open(info, "w", force_zip64=True) as target,
            ):
                while block := source.read(chunk):
                    target.write(block)
                    if out := sink.take():
                        yield out
            if out := sink.take():
                yield out
    if out := sink.take():
        yield out


def images_for_model(version_ids: list[str]) -> tuple[Image, ...]:
    """Attached images as model input (read when the run takes the message)."""
    if not version_ids:
        return ()
    images = []
    for version in ArtifactVersion.objects.filter(pk__in=version_ids, kind=Kind.IMAGE):
        try:
            data = read_bytes(version)
        except OSError:
            logger.warning("attached image %s is gone from storage", version.pk)
            continue
        images.append(Image(base64.b64encode(data).decode("ascii"), version.mime))
    return tuple(images)
