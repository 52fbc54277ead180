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

    class Kind(models.TextChoices):
        CHAT = "chat"
        CLASSROOM = "classroom"  # a student's chat of a class (the classroom app sets it up)

    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    agent = models.ForeignKey("Agent", null=True, blank=True, on_delete=models.PROTECT)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CHAT)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    pinned_at = models.DateTimeField(null=True, blank=True)  # pinned chats come first
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


class Provider(models.Model):
    """An LLM endpoint configured by an admin. Base URLs and keys are admin-only."""

    class Kind(models.TextChoices):
        OPENAI = "openai", "OpenAI-compatible"
        DEMO = "demo", "Offline demo model"

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.OPENAI)
    base_url = models.URLField(max_length=500, blank=True)
    api_key = models.CharField(max_length=500, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class ProviderModel(models.Model):
    """A whitelisted model: users pick ``alias``; the provider only ever sees ``model_id``."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="models")
    alias = models.CharField(max_length=100, unique=True)
    model_id = models.CharField(max_length=200)
    context_window = models.PositiveIntegerField(default=32_000)
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["alias"]

    def __str__(self) -> str:
        return self.alias


class Agent(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=64, unique=True)
    system_prompt = models.TextField(blank=True)
    default_model = models.CharField(max_length=100, blank=True, help_text="a model alias")
    tools = models.JSONField(default=list, blank=True, help_text="names of enabled tools")
    tool_policies = models.JSONField(
        default=dict, blank=True, help_text='per-tool approval: {"write_file": "ask"}'
    )
    max_rounds = models.PositiveIntegerField(default=12)
    is_default = models.BooleanField(default=False)
    personas = models.JSONField(
        default=list,
        blank=True,
        help_text="names this agent speaks as; with names, one reply may hold up to three "
        "of them, each its own labelled message",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Run(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        WAITING = "waiting", "waiting for approval"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"
        INTERRUPTED = "interrupted"

    TERMINAL = {Status.COMPLETED, Status.CANCELLED, Status.FAILED, Status.INTERRUPTED}

    class Kind(models.TextChoices):
        REPLY = "reply"
        COMPACT = "compact", "compact now"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    chat = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="runs")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.REPLY)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    model = models.CharField(max_length=100)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    usage_estimated = models.BooleanField(default=False)
    error_category = models.CharField(max_length=32, blank=True)
    error_message = models.TextField(blank=True)
    partial_text = models.TextField(blank=True)
    partial_reasoning = models.TextField(blank=True)
    # The cast of a run that speaks with several voices (names); empty: the main agent.
    # Its partial text is then the raw tagged text, split again wherever it is shown.
    speakers = models.JSONField(default=list, blank=True)
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # proves a process still runs it
    # Taken by the one process that executes the current leg of the run (see runner._prepare).
    claimed = models.BooleanField(default=False)
    cancel_requested = models.BooleanField(default=False)
    iteration = models.PositiveIntegerField(default=0)
    thinking = models.BooleanField(default=True)
    # While WAITING: the assistant tool-call message whose calls await approval.
    pending_message = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["chat", "status"], name="run_chat_status"),
            # The runs no process has claimed yet (runner.unclaimed_runs): a handful.
            models.Index(
                fields=["started_at"],
                name="run_unclaimed",
                condition=models.Q(status="running", claimed=False),
            ),
        ]
        constraints = [
            # One live run per chat: the database enforces it, not just the code.
            models.UniqueConstraint(
                fields=["chat"],
                condition=models.Q(status__in=["running", "waiting"]),
                name="one_live_run_per_chat",
            )
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} ({self.status})"

    @property
    def is_live(self) -> bool:
        return self.status in {self.Status.RUNNING, self.Status.WAITING}


class QueuedInput(models.Model):
    """A user message sent to a chat; ``client_id`` makes a double send a no-op."""

    chat = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="inputs")
    client_id = models.CharField(max_length=64)
    content = models.TextField()
    display_seq = models.PositiveBigIntegerField(null=True)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL)
    consumed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["chat", "client_id"], name="input_client_id_unique")
        ]
        indexes = [models.Index(fields=["chat", "consumed"], name="input_pending")]

    def __str__(self) -> str:
        return f"Input {self.client_id} to {self.chat_id}"


class ToolApproval(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"

    chat = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="approvals")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    call_id = models.CharField(max_length=100)
    tool_name = models.CharField(max_length=100)
    arguments = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["chat", "call_id"], name="approval_call_unique")
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.call_id} ({self.status})"


class ChatToolGrant(models.Model):
    """The "allow for this chat" answer: the tool runs without asking for the rest of the chat."""

    chat = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="tool_grants")
    tool_name = models.CharField(max_length=100)
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["chat", "tool_name"], name="grant_unique")]

    def __str__(self) -> str:
        return f"{self.tool_name} allowed in {self.chat_id}"


class ApiKey(models.Model):
    """A bearer key for the HTTP API and the relay. Only a SHA-256 of it is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
