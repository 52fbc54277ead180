"""A chat's title, written by its own model after the first reply.

The first message gives a chat its provisional title at once (``actions``). Once the
first reply is complete, the run's process asks the chat's model for a short title, off
the run's path (the stream and the next run do not wait for it), and stores it unless
the title was changed meanwhile (a person's rename always wins).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction

from chat import store
from chat.core.messages import ChatMessage
from chat.core.prompts import TITLE_ASSISTANT_LABEL, TITLE_INSTRUCTIONS, TITLE_USER_LABEL
from chat.live.doorbell import ring
from chat.llm.types import ChatRequest, ProviderError
from chat.llm.types import Provider as LLMProvider
from chat.models import ChatSession

logger = logging.getLogger(__name__)

PROVISIONAL_TITLE_CHARS = 50
TITLE_MAX_CHARS = 80
TITLE_MAX_TOKENS = 24
EXCERPT_CHARS = 600
TITLE_TIMEOUT = 20.0

_tasks: set[asyncio.Task] = set()


def provisional_title(first_message: str) -> str:
    return first_message.strip().splitlines()[0][:PROVISIONAL_TITLE_CHARS] if first_message else ""


def set_title(chat_id, title: str, *, generated: bool = False) -> list:
    """Store ``title`` (inside a transaction); the caller rings for the rows returned."""
    ChatSession.objects.filter(pk=chat_id).update(title=title)
    payload: dict[str, object] = {"type": "title", "title": title}
    if generated:
        payload["generated"] = True
    return store.append_display(chat_id, [payload])


def _first_exchange(chat_id) -> tuple[str, str, str] | None:
    """(provisional title, first user message, first reply) when the chat is due a title."""
    chat = ChatSession.objects.filter(pk=chat_id).only("title").first()
    if chat is None:
        return None
    first_user = first_reply = ""
    completes = 0
    for event in store.display_events_after(chat_id, 0):
        if event.kind == "title" and event.payload.get("generated"):
            return None  # titled once already
        if event.kind == "complete":
            completes += 1
        elif event.kind == "msg":
            message = ChatMessage.from_dict(event.payload)
            if message.role == "user" and not first_user:
                first_user = message.content
            elif message.role == "assistant" and message.content and not first_reply:
                first_reply = message.content
    provisional = provisional_title(first_user)
    if completes != 1 or not first_user or chat.title != provisional:
        return None
    return provisional, first_user, first_reply


def clean_title(text: str) -> str:
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"^(?:title\s*:\s*)", "", line.strip(), flags=re.I)
    line = line.strip().strip("\"'“”‘’`*#").strip().rstrip(".")
    return " ".join(line.split())[:TITLE_MAX_CHARS]


def _store_if_unchanged(chat_id, provisional: str, title: str) -> bool:
    with transaction.atomic():
        chat = ChatSession.objects.select_for_update().filter(pk=chat_id).first()
        if chat is None or chat.title != provisional or title == chat.title:
            return False
        ring(chat_id, set_title(chat_id, title, generated=True))
    return True


async def generate_title(chat_id, provider: LLMProvider, model_id: str) -> str | None:
    """Ask the model for a title after the first reply; returns the title stored, if any."""
    due = await database_sync_to_async(_first_exchange)(chat_id)
    if due is None:
        return None
    provisional, question, answer = due
    prompt = (
        f"{TITLE_INSTRUCTIONS}\n\n{TITLE_USER_LABEL}{question[:EXCERPT_CHARS]}\n"
        f"{TITLE_ASSISTANT_LABEL}{answer[:EXCERPT_CHARS]}"
    )
    request = ChatRequest(
        model=model_id,
        messages=[ChatMessage(role="user", content=prompt)],
        max_tokens=TITLE_MAX_TOKENS,
        thinking=False,
    )
    try:
        end = await asyncio.wait_for(provider.complete(request), TITLE_TIMEOUT)
    except (ProviderError, TimeoutError):
        logger.info("no title for chat %s: the model did not answer", chat_id)
        return None
    title = clean_title(end.text)
    if not title:
        return None
    stored = await database_sync_to_async(_store_if_unchanged)(chat_id, provisional, title)
    return title if stored else None


def title_soon(chat_id, provider: LLMProvider, model_id: str) -> None:
    """Generate the title in the background (the caller's run is over).

    ``LYCEUM_GENERATE_TITLES = False`` turns it off (the test suite does, so a test that
    counts a model's requests counts the chat's own).
    """
    if not settings.LYCEUM_GENERATE_TITLES:
        return

    async def quietly() -> None:
        try:
            await generate_title(chat_id, provider, model_id)
        except Exception:  # noqa: BLE001 - a title is never worth a failed run
            logger.warning("title generation failed for chat %s", chat_id, exc_info=True)

    # A fresh context, as for runs: the caller's would tie database calls to its thread.
    task = asyncio.get_running_loop().create_task(quietly(), context=contextvars.Context())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def wait_for_titles() -> None:
    """Tests and shutdown: let titles being written finish."""
    if _tasks:
        await asyncio.gather(*list(_tasks), return_exceptions=True)
