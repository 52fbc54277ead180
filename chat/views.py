"""Thin views: fetch with permission, call the store, render."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from chat import display, store
from chat.access import ChatAction, access_chat
from chat.models import ChatSession

PAGE_SIZE = 50


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    chats = ChatSession.objects.filter(owner=request.user).only("id", "title", "updated_at")
    return render(request, "chat/home.html", {"chats": chats[:200]})


@require_POST
def chat_new(request: HttpRequest) -> HttpResponse:
    chat = store.create_chat(request.user)
    return redirect("chat_detail", chat_id=chat.pk)


@require_GET
def chat_detail(request: HttpRequest, chat_id) -> HttpResponse:
    chat = access_chat(request.user, chat_id, ChatAction.VIEW)
    events = store.display_events_before(chat.pk, None, PAGE_SIZE)
    items = display.build_items(events)
    return render(request, "chat/detail.html", {"chat": chat, "items": items})
