"""Thin views: fetch with permission, call the store or an action, render."""

from __future__ import annotations

import json
import uuid

from django.contrib import messages
from django.db.models import F
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from chat import actions, artifacts, search, store
from chat.access import ChatAction, ViewHow, access_chat, can_access_chat, note_view
from chat.apikeys import revoke_api_key
from chat.catalog import available_models
from chat.models import Agent, ApiKey, ChatSession
from chat.panels import home_panels
from chat.presentation import exports, fragments
from chat.presentation.pages import PAGE_ITEMS, page_of_items, resume_seq
from chat.runhost import transitions

MAX_JUMP_ITEMS = 2_000
SIDEBAR_CHATS = 100
NEW_KEY_SESSION = "lyceum_new_api_key"
# A refusal by one of the user's limits (chat/quotas.py): "slow down" or "you hold too many".
LIMIT_STATUS = {"rate_limited": 429, "too_many_runs": 429, "too_many_chats": 403}


def sidebar_chats(user, query: str = ""):
    # A class chat is opened from its class ("Classes"), not listed among the chats.
    chats = (
        ChatSession.objects.filter(owner=user, kind=ChatSession.Kind.CHAT)
        .only("id", "title", "updated_at", "pinned_at")
        .order_by(F("pinned_at").desc(nulls_last=True), "-updated_at")
    )
    if query:
        chats = chats.filter(title__icontains=query)
    return chats[:SIDEBAR_CHATS]


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "chat/home.html",
        {
            "chats": sidebar_chats(request.user),
            "panels": home_panels(request),
            **_new_chat_options(),
        },
    )


def _new_chat_options() -> dict:
    return {"agents": Agent.objects.all(), "models": available_models()}


@require_POST
def chat_start(request: HttpRequest) -> HttpResponse:
    """The home page's composer: the chat is made with its first message, never empty."""
    try:
        result = actions.start_chat_and_send(
            request.user,
            request.POST.get("message", ""),
            request.POST.get("client_id", "") or uuid.uuid4().hex,
            agent_slug=request.POST.get("agent", ""),
            model=request.POST.get("model", ""),
        )
    except actions.ActionError as exc:
        return render(
            request,
            "chat/home.html",
            {
                "chats": sidebar_chats(request.user),
                "error": exc.message,
                "draft": request.POST.get("message", ""),
                "chosen_agent": request.POST.get("agent", ""),
                "chosen_model": request.POST.get("model", ""),
                **_new_chat_options(),
            },
            status=LIMIT_STATUS.get(exc.code, 400),
        )
    return redirect("chat_detail", chat_id=result.chat_id)


@require_GET
def chat_search(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "").strip()[:100]
    return render(
        request,
        "chat/_chat_list.html",
        {
            "chats": sidebar_chats(request.user, query),
            "query": query,
            "hits": search.search_messages(request.user, query) if query else [],
        },
    )


@require_POST
def chat_pin(request: HttpRequest, chat_id) -> HttpResponse:
    actions.pin_chat(request.user, chat_id, pinned=request.POST.get("pinned") == "1")
    return _back(request)


def _back(request: HttpRequest) -> HttpResponse:
    """To the page the form was on (this site's only), else home."""
    target = request.POST.get("next", "")
    if target.startswith("/") and not target.startswith("//"):
        return redirect(target)
    return redirect("home")


@require_POST
def chat_new(request: HttpRequest) -> HttpResponse:
    agent = None
    if slug := request.POST.get("agent"):
        agent = Agent.objects.filter(slug=slug).first()
    try:
        chat = actions.new_chat(request.user, agent=agent, model=request.POST.get("model", ""))
    except actions.ActionError as exc:
        messages.error(request, exc.message)
        return redirect("home")
    return redirect("chat_detail", chat_id=chat.pk)


@require_GET
def chat_detail(request: HttpRequest, chat_id) -> HttpResponse:
    chat = access_chat(request.user, chat_id, ChatAction.VIEW)
    note_view(request.user, chat, ViewHow.PAGE)
    page = page_of_items(chat.pk, limit=_items_to_show(chat.pk, request.GET.get("at", "")))
    live = transitions.live_run(chat)
    usage = store.latest_display_payload(chat.pk, "context_usage")
    return render(
        request,
        "chat/detail.html",
        {
            "chat": chat,
            "page": page,
            "last_seq": resume_seq(chat, page),
            "live_run": live,
            "stream_html": _stream_html(live),
            "context_usage": usage,
            "panel": artifacts.panel(chat.pk),
            "models": available_models(),
            "chats": sidebar_chats(request.user),
            "can_write": can_access_chat(request.user, chat, ChatAction.WRITE),
            "can_manage": can_access_chat(request.user, chat, ChatAction.MANAGE),
            **_new_chat_options(),
        },
    )


def _items_to_show(chat_id, at: str) -> int:
    """Enough items to reach event ``at`` (a search hit), from there to the newest."""
    try:
        seq = int(at)
    except ValueError:
        return PAGE_ITEMS
    newer = store.count_display_events_from(chat_id, seq)
    return min(max(PAGE_ITEMS, newer + 1), MAX_JUMP_ITEMS)


def _stream_html(run) -> str:
    """The reply being written when the page loads (a waiting run types nothing)."""
    if run is None or run.status != run.Status.RUNNING:
        return mark_safe(fragments.stream_slot(oob=False))  # noqa: S308 - our template
    html = fragments.partial_stream_slot(
        str(run.pk), run.partial_text, run.partial_reasoning, run.speakers, oob=False
    )
    return mark_safe(html)  # noqa: S308 - rendered by our template, markdown sanitised


@require_GET
def chat_older(request: HttpRequest, chat_id) -> HttpResponse:
    chat = access_chat(request.user, chat_id, ChatAction.VIEW)
    note_view(request.user, chat, ViewHow.PAGE)
    try:
        before = int(request.GET.get("before", ""))
    except ValueError:
        return HttpResponse("'before' must be a number", status=400)
    page = page_of_items(chat.pk, before)
    return render(request, "chat/_older.html", {"chat": chat, "page": page})


@require_POST
def chat_rename(request: HttpRequest, chat_id) -> HttpResponse:
    try:
        actions.rename_chat(request.user, chat_id, request.POST.get("title", ""))
    except actions.ActionError as exc:
        messages.error(request, exc.message)
    chat = access_chat(request.user, chat_id, ChatAction.VIEW)
    if request.htmx:
        return render(request, "chat/_title.html", {"chat": chat, "can_write": True})
    return redirect("chat_detail", chat_id=chat.pk)


@require_http_methods(["GET", "POST"])
def chat_delete(request: HttpRequest, chat_id) -> HttpResponse:
    chat = access_chat(request.user, chat_id, ChatAction.MANAGE)
    if request.method == "POST":
        title = actions.delete_chat(request.user, chat.pk)
        messages.success(request, _("Deleted “%(title)s”.") % {"title": title})
        return redirect("home")
    return render(request, "chat/delete.html", {"chat": chat})


@require_GET
def chat_export(request: HttpRequest, chat_id, fmt: str) -> HttpResponse:
    chat = access_chat(request.user, chat_id, ChatAction.VIEW)
    if fmt not in ("md", "json"):
        raise Http404("Unknown export format")
    note_view(request.user, chat, ViewHow.EXPORT)
    with_reasoning = request.GET.get("reasoning") == "1"
    events = store.display_events_after(chat.pk, 0)
    if fmt == "json":
        body = json.dumps(
            exports.as_json(chat, events, with_reasoning=with_reasoning),
            ensure_ascii=False,
            indent=2,
        )
        content_type = "application/json; charset=utf-8"
    else:
        body = exports.as_markdown(chat, events, with_reasoning=with_reasoning)
        content_type = "text/markdown; charset=utf-8"
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = (
        f'attachment; filename="{exports.filename(chat, fmt, with_reasoning=with_reasoning)}"'
    )
    response["X-Content-Type-Options"] = "nosniff"
    return response


@require_http_methods(["GET", "POST"])
def api_keys(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        if revoke := request.POST.get("revoke"):
            if revoke_api_key(request.user, revoke):
                messages.success(request, _("The key was revoked."))
            return redirect("api_keys")
        try:
            _key, secret = actions.new_api_key(request.user, request.POST.get("name", "").strip())
        except actions.ActionError as exc:
            messages.error(request, exc.message)
            return redirect("api_keys")
        # Post, redirect, get: a refresh shows the list again, never makes a second key.
        # The secret waits in the session for the one page that shows it.
        request.session[NEW_KEY_SESSION] = secret
        return redirect("api_keys")
    new_key = request.session.pop(NEW_KEY_SESSION, None)
    keys = ApiKey.objects.filter(user=request.user).order_by("-created_at")
    response = render(
        request, "chat/api_keys.html", {"keys": keys, "new_key": new_key, "now": timezone.now()}
    )
    # The new key is shown once: no cache (nor the back button) may keep the page.
    response["Cache-Control"] = "no-store"
    return response
