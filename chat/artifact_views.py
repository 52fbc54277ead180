"""Thin views of artifacts: the artifact page, its preview, downloads, the zip, uploads.

Every view fetches through ``access_artifact`` / ``access_chat``: another chat's
artifact is 404 everywhere. Content is never served as the app: downloads are
``attachment`` with a server-chosen type and ``nosniff``; the preview of HTML and SVG
is a document whose ``Content-Security-Policy: sandbox`` gives it an opaque origin,
shown in ``<iframe sandbox="allow-scripts">``.
"""

from __future__ import annotations

import difflib
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils.http import content_disposition_header
from django.utils.translation import gettext as _
from django.views.decorators.clickjacking import xframe_options_sameorigin
from django.views.decorators.http import require_GET, require_POST

from chat import actions, artifacts
from chat.access import (
    ChatAction,
    ViewHow,
    access_artifact,
    access_chat,
    access_version,
    note_view,
)
from chat.core.artifacts import PREVIEW_KINDS, Kind, safe_filename
from chat.models import Artifact, ArtifactVersion
from chat.presentation.artifacts import highlighted, render_markdown_file

# The document of a preview: its own opaque origin (sandbox without allow-same-origin),
# its inline script and style allowed, nothing fetched from anywhere, framed only by us.
PREVIEW_CSP = (
    "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'"
)
# Anything else sent from an artifact: never a document that can run anything.
DOWNLOAD_CSP = "sandbox; default-src 'none'"
INLINE_IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
MAX_VIEW_BYTES = 2 * 1024 * 1024  # bigger text is offered as a download, not shown


def _version_or_latest(artifact: Artifact, raw: str | None) -> ArtifactVersion:
    number = artifact.version_count
    if raw:
        try:
            number = int(raw)
        except ValueError:
            raise Http404("No such version") from None
    try:
        version = artifact.versions.get(number=number)
    except ArtifactVersion.DoesNotExist:
        raise Http404("No such version") from None
    version.artifact = artifact
    return version


@require_GET
def artifact_detail(request: HttpRequest, artifact_id) -> HttpResponse:
    artifact = access_artifact(request.user, artifact_id)
    note_view(request.user, artifact.chat, ViewHow.ARTIFACT)
    version = _version_or_latest(artifact, request.GET.get("v"))
    versions = list(artifact.versions.all())
    kind = Kind(version.kind)
    text = artifacts.read_text(version) if version.size <= MAX_VIEW_BYTES else None
    body = ""
    if text is not None:
        if kind == Kind.MARKDOWN:
            body = render_markdown_file(text)
        else:
            body = highlighted(text, version.language)
    diff_html, other = "", None
    if raw_other := request.GET.get("diff"):
        other = _version_or_latest(artifact, raw_other)
        old = artifacts.read_text(other) if other.size <= MAX_VIEW_BYTES else None
        if old is not None and text is not None:
            lines = difflib.unified_diff(
                old.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"version {other.number}",
                tofile=f"version {version.number}",
            )
            diff_html = highlighted("".join(lines) or "(no changes)\n", "diff")
    return render(
        request,
        "chat/artifacts/detail.html",
        {
            "artifact": artifact,
            "chat": artifact.chat,
            "version": version,
            "versions": versions,
            "body": body,
            "is_text": text is not None,
            "preview": kind in PREVIEW_KINDS,
            "inline_image": version.mime in INLINE_IMAGE_TYPES,
            "diff_html": diff_html,
            "other": other,
            "source": text or "",
        },
    )


def _content_response(version: ArtifactVersion, *, attachment: bool) -> FileResponse:
    handle = artifacts.storage().open(version.storage_name, "rb")
    response = FileResponse(
        handle,
        as_attachment=attachment,
        filename=safe_filename(version.artifact.path),
        content_type=version.mime,
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-cache"
    response["Cross-Origin-Resource-Policy"] = "same-origin"
    return response


@require_GET
def artifact_download(request: HttpRequest, artifact_id, number: int) -> HttpResponseBase:
    version = access_version(request.user, artifact_id, number)
    note_view(request.user, version.artifact.chat, ViewHow.ARTIFACT)
    response = _content_response(version, attachment=True)
    response["Content-Security-Policy"] = DOWNLOAD_CSP
    return response


@require_GET
def artifact_raw(request: HttpRequest, artifact_id, number: int) -> HttpResponseBase:
    """A raster image, inline (for ``<img>``); nothing else is served inline."""
    version = access_version(request.user, artifact_id, number)
    note_view(request.user, version.artifact.chat, ViewHow.ARTIFACT)
    if version.mime not in INLINE_IMAGE_TYPES:
        raise Http404("Not an image")
    response = _content_response(version, attachment=False)
    response["Content-Security-Policy"] = DOWNLOAD_CSP
    return response


@require_GET
@xframe_options_sameorigin
def artifact_preview(request: HttpRequest, artifact_id, number: int) -> HttpResponseBase:
    """HTML or SVG as a sandboxed document: an opaque origin, no reach into the app."""
    version = access_version(request.user, artifact_id, number)
    note_view(request.user, version.artifact.chat, ViewHow.ARTIFACT)
    if Kind(version.kind) not in PREVIEW_KINDS:
        raise Http404("No preview for this kind of file")
    response = _content_response(version, attachment=False)
    response["Content-Security-Policy"] = PREVIEW_CSP
    response["Content-Disposition"] = "inline"
    return response


@require_GET
def chat_artifacts(request: HttpRequest, chat_id) -> HttpResponse:
    chat = access_chat(request.user, chat_id, ChatAction.VIEW)
    note_view(request.user, chat, ViewHow.ARTIFACT)
    rows = Artifact.objects.filter(chat=chat).order_by("-updated_at", "-pk")
    return render(request, "chat/artifacts/list.html", {"chat": chat, "artifacts": rows})


@require_GET
def chat_artifacts_zip(request: HttpRequest, chat_id) -> HttpResponseBase:
    """The latest version of every artifact, as a zip made while it is sent."""
    chat = access_chat(request.user, chat_id, ChatAction.VIEW)
    note_view(request.user, chat, ViewHow.ARTIFACT)
    entries = artifacts.zip_entries(chat.pk)
    chunks = artifacts.zip_stream(entries)
    body = _async_chunks(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(body, content_type="application/zip")
    name = safe_filename(f"{chat.display_title}.zip", fallback="artifacts.zip")
    response["Content-Disposition"] = content_disposition_header(True, name)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = DOWNLOAD_CSP
    response["Cache-Control"] = "private, no-cache"
    return response


async def _async_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """The sync chunks read in a worker thread each, so the event loop never blocks."""
    step = sync_to_async(_next_chunk, thread_sensitive=False)
    while True:
        chunk = await step(chunks)
        if chunk is None:
            return
        yield chunk


def _next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


@require_POST
def chat_attach(request: HttpRequest, chat_id) -> HttpResponse:
    """Upload one file (field ``file``) to attach to the next message; its version id."""
    upload = request.FILES.get("file")
    if upload is None:
        return JsonResponse({"error": _("Choose a file to attach.")}, status=400)
    limit = settings.LYCEUM_ARTIFACT_MAX_BYTES
    if upload.size is not None and upload.size > limit:
        return JsonResponse(
            {
                "error": _("%(name)s is %(size)s; the limit is %(limit)s per file.")
                % {
                    "name": upload.name,
                    "size": artifacts.human_size(upload.size),
                    "limit": artifacts.human_size(limit),
                }
            },
            status=413,
        )
    try:
        version = actions.attach_file(request.user, chat_id, upload.name or "file", upload.read())
    except actions.ActionError as exc:
        status = 413 if exc.code in ("too_large", "chat_full", "over_quota") else 400
        return JsonResponse({"error": exc.message}, status=status)
    return JsonResponse(attachment_json(version), status=201)


def attachment_json(version: ArtifactVersion) -> dict:
    return {
        "id": str(version.pk),
        "artifact_id": str(version.artifact_id),
        "version": version.number,
        "name": version.artifact.path,
        "kind": version.kind,
        "size": version.size,
        "size_text": artifacts.human_size(version.size),
    }
