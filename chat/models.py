"""Chats and their append-only event log.

The log has two channels per chat: ``session`` (what the model sees, written at
safe cuts) and ``display`` (what people see, every event numbered by a gap-free
``seq`` that browsers use to resync). Rows are never updated or deleted except
by deleting the whole chat.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class ChatSession(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chats"
    )
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Last seq handed out per channel; bumped under a row lock so seqs are gap-free.
    last_display_seq = models.PositiveBigIntegerField(default=0)
    last_session_seq = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="chat_owner_recent")]

    def __str__(self) -> str:
        return self.title or f"Chat {self.pk}"

    @property
    def display_title(self) -> str:
        return self.title or "New chat"


class ChatEvent(models.Model):
    class Channel(models.TextChoices):
        SESSION = "session"
        DISPLAY = "display"

    chat = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="events")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=32)
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["chat", "channel", "seq"], name="chat_event_seq_unique")
        ]

    def __str__(self) -> str:
        return f"{self.chat_id}/{self.channel}#{self.seq} {self.kind}"
