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
from django.utils.translation import gettext


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
    # The interface language of whoever started the chat (a code of LANGUAGES, "" when
    # unknown): its runs render their live fragments in it, and the model is asked to
    # answer in it (chat.runhost.setup).
    language = models.CharField(max_length=16, blank=True, default="")
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
        return self.title or gettext("New chat")


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
        # A chat's fork and switch events are read before its display events (store.
        # branch_shape): most chats have none, and finding that must not scan the chat.
        indexes = [
            models.Index(
                fields=["chat", "seq"],
                condition=models.Q(kind__in=["fork", "switch"]),
                name="chat_event_branches",
            )
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

    def save(self, *args, **kwargs) -> None:
        # A key never follows the provider to a new address: the pool's keys stop with a
        # changed base URL, whatever path changed it, until each is entered again (the
        # admin's forms ask for the provider's own key again themselves).
        if self.pk is not None:
            before = Provider.objects.filter(pk=self.pk).values_list("base_url", flat=True).first()
            if before is not None and before.rstrip("/") != (self.base_url or "").rstrip("/"):
                ProviderKey.objects.filter(provider_id=self.pk, enabled=True).update(
                    enabled=False, last_error=KEY_AFTER_URL_CHANGE
                )
        super().save(*args, **kwargs)


KEY_AFTER_URL_CHANGE = "The provider's base URL changed: enter this key again."


class ProviderModel(models.Model):
    """A whitelisted model: users pick ``alias``; the provider only ever sees ``model_id``."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="models")
    alias = models.CharField(max_length=100, unique=True)
    model_id = models.CharField(max_length=200)
    context_window = models.PositiveIntegerField(default=32_000)
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    accepts_images = models.BooleanField(
        default=False, help_text="the model takes images as input (attached images go to it)"
    )

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
    # Times the sweeper handed this leg over again because nobody claimed it in time.
    redispatched = models.PositiveSmallIntegerField(default=0)
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
    # Ids of attached image versions, read into the request when the run takes the input.
    images = models.JSONField(default=list, blank=True)
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


class Artifact(models.Model):
    """A named file of one chat (its path in the agent's workspace), with versions.

    Written by the agent's file tools, kept from a reply's code blocks, or attached by
    the user. A later write to the same path is a new version, never a new artifact.
    """

    class Source(models.TextChoices):
        FILE = "file", "written by a tool"
        CODE = "code", "code block of a reply"
        ATTACHMENT = "attachment", "attached by the user"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    chat = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=1024)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.FILE)
    # Of the latest version (what the panel and the workspace show).
    kind = models.CharField(max_length=16, default="text")
    language = models.CharField(max_length=32, blank=True)
    size = models.PositiveBigIntegerField(default=0)
    version_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["chat", "path"], name="artifact_path_unique")
        ]
        indexes = [models.Index(fields=["chat", "-updated_at"], name="artifact_chat_recent")]

    def __str__(self) -> str:
        return f"{self.path} ({self.chat_id})"

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class ArtifactVersion(models.Model):
    """One version's content, kept through Django's storage API under a server-made name."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    storage_name = models.CharField(max_length=300)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    kind = models.CharField(max_length=16)
    language = models.CharField(max_length=32, blank=True)
    mime = models.CharField(max_length=100)
    # The display event that shows it (its card, or the message it was attached to).
    seq = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["number"]
        constraints = [
            models.UniqueConstraint(fields=["artifact", "number"], name="artifact_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.artifact_id} v{self.number}"


# --- the relay (chat/relay/) ------------------------------------------------------------------


class ProviderKey(models.Model):
    """One upstream key of a provider's pool, stored encrypted (``chat.relay.secrets``)."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="keys")
    label = models.CharField(max_length=64, blank=True, help_text="shown instead of the key")
    secret = models.TextField(help_text="encrypted at rest; never shown")
    enabled = models.BooleanField(default=True)
    cooldown_until = models.DateTimeField(null=True, blank=True)
    requests = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.provider_id}/{self.label or self.pk}"


class RelayLimit(models.Model):
    """Limits of one user, or of one API key (which then also applies); empty = the default."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="relay_limit",
    )
    api_key = models.OneToOneField(
        "ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="relay_limit"
    )
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    burst = models.PositiveIntegerField(null=True, blank=True)
    monthly_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="0 = no budget; empty = the site default"
    )

    def __str__(self) -> str:
        return f"limits of {self.user_id or ''}{'key ' + str(self.api_key_id) if self.api_key_id else ''}"


class UsageCounter(models.Model):
    """Admission state of one scope (a user, an API key, a door's bucket) in one month,
    without Redis."""

    scope = models.CharField(max_length=64)
    period = models.CharField(max_length=7)  # "2026-01"
    used_tokens = models.BigIntegerField(default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    bucket = models.FloatField(default=-1.0)  # requests left in the burst; -1 = full
    bucket_at = models.FloatField(default=0.0)  # Unix time of the last refill
    locked_until = models.FloatField(default=0.0)  # Unix time a door's lockout ends

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "period"], name="usage_counter_unique")
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.period}"


class UsageRecord(models.Model):
    """One relay request, or one chat run (``source``), with what it cost."""

    class Source(models.TextChoices):
        RELAY = "relay"
        CHAT = "chat"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_records"
    )
    api_key = models.ForeignKey("ApiKey", null=True, blank=True, on_delete=models.SET_NULL)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.RELAY)
    run = models.OneToOneField("Run", null=True, blank=True, on_delete=models.SET_NULL)
    model = models.CharField(max_length=200, blank=True)
    provider = models.CharField(max_length=64, blank=True)
    provider_key = models.ForeignKey(ProviderKey, null=True, blank=True, on_delete=models.SET_NULL)
    stream = models.BooleanField(default=False)
    status = models.CharField(max_length=16)  # ok, failed, cancelled, refused
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=200, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    estimated = models.BooleanField(default=False)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    session_key = models.CharField(max_length=200, blank=True)
    agent_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["user", "-created_at"], name="usage_user_recent")]

    def __str__(self) -> str:
        return f"{self.source} {self.model} {self.status}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class RelaySession(models.Model):
    """The chat a relay ``session_key`` of one user writes to."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    session_key = models.CharField(max_length=200)
    chat = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "session_key"], name="relay_session_unique")
        ]

    def __str__(self) -> str:
        return self.session_key
