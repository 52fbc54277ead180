"""Classrooms: a teacher's class, its enrolled students, its scenes and its cast of AI personas.

A student's chat of a class is a chat of kind ``classroom`` (``chat.models.ChatSession``),
linked here by :class:`ClassroomChat`, so everything a chat guarantees holds for it.
Chat never imports this app; the app plugs into chat through its seams (a chat policy,
a run setup), registered in :mod:`classroom.apps`.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils.translation import gettext_lazy as _

# No 0/O, 1/I/L: a code read aloud or copied from a board is typed right.
JOIN_CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
JOIN_CODE_LENGTH = 8
SCENE_CONTENT_MAX = 20_000  # characters of markdown
SCENE_CONTEXT_MAX = 2_000  # characters of the digest that goes into the prompt
DEFAULT_GUARDRAIL = (
    "Guide the student step by step; never give the final answer to an exercise or a quiz "
    "question. Ask a question back, give a hint, or check what they tried."
)


def new_join_code() -> str:
    return "".join(secrets.choice(JOIN_CODE_ALPHABET) for _ in range(JOIN_CODE_LENGTH))


class Classroom(models.Model):
    title = models.CharField(max_length=200)
    subject = models.CharField(max_length=200, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="classrooms_owned"
    )
    co_teachers = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="classrooms_cotaught"
    )
    join_code = models.CharField(max_length=16, unique=True, default=new_join_code)
    # None: the code works until it is regenerated.
    join_code_expires_at = models.DateTimeField(null=True, blank=True)
    model = models.CharField(max_length=100, blank=True, help_text="a model alias")
    current_scene = models.ForeignKey(
        "Scene", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # While set, no LLM call is made for the class (the supervision issue acts on it).
    ai_paused = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.title

    def is_teacher(self, user) -> bool:
        if not user.is_authenticated:
            return False
        if self.owner_id == user.pk:
            return True
        return self.co_teachers.filter(pk=user.pk).exists()


class Enrollment(models.Model):
    classroom = models.ForeignKey(Classroom, on_delete=models.CASCADE, related_name="enrollments")
    student = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="enrollments"
    )
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["joined_at"]
        constraints = [
            models.UniqueConstraint(fields=["classroom", "student"], name="enrollment_unique")
        ]

    def __str__(self) -> str:
        return f"{self.student} in {self.classroom}"


class Scene(models.Model):
    class Kind(models.TextChoices):
        LECTURE = "lecture", _("Lecture")
        DISCUSSION = "discussion", _("Discussion")
        QUIZ = "quiz", _("Quiz")
        PRACTICE = "practice", _("Practice")

    classroom = models.ForeignKey(Classroom, on_delete=models.CASCADE, related_name="scenes")
    position = models.PositiveIntegerField(default=0)
    title = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.LECTURE)
    content = models.TextField(blank=True)
    # The digest that goes into the prompt; rebuilt from the content on save unless the
    # teacher wrote it (context_edited).
    scene_context = models.TextField(blank=True)
    context_edited = models.BooleanField(default=False)
    guardrail = models.TextField(blank=True, default=DEFAULT_GUARDRAIL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "pk"]

    def __str__(self) -> str:
        return self.title

    @property
    def number(self) -> int:
        """1-based place in the class's order (what students see: "Scene 2: …")."""
        return (
            Scene.objects.filter(classroom_id=self.classroom_id)
            .filter(
                models.Q(position__lt=self.position)
                | models.Q(position=self.position, pk__lt=self.pk)
            )
            .count()
            + 1
        )


class Persona(models.Model):
    class Role(models.TextChoices):
        TEACHER = "teacher", _("AI teacher")
        ASSISTANT = "assistant", _("teaching assistant")
        STUDENT = "student", _("AI classmate")

    classroom = models.ForeignKey(Classroom, on_delete=models.CASCADE, related_name="personas")
    position = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=40)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.STUDENT)
    prompt = models.TextField(blank=True)
    avatar = models.CharField(max_length=16, default="🙂")
    colour = models.CharField(max_length=7, default="#2563eb")  # #rrggbb
    model = models.CharField(max_length=100, blank=True, help_text="empty: the class's model")
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["position", "pk"]
        constraints = [
            models.UniqueConstraint("classroom", Lower("name"), name="persona_name_unique_in_class")
        ]

    def __str__(self) -> str:
        return self.name


class ClassroomChat(models.Model):
    """One chat per (classroom, student): the student's own class chat."""

    classroom = models.ForeignKey(Classroom, on_delete=models.CASCADE, related_name="chats")
    student = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="classroom_chats"
    )
    chat = models.OneToOneField(
        "chat.ChatSession", on_delete=models.CASCADE, related_name="classroom_link"
    )
    # Scene context a client sent with its last API call (seed 001's optional
    # ``scene_context``); added to the class's own for the runs that follow.
    client_scene_context = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["classroom", "student"], name="classroom_chat_unique")
        ]

    def __str__(self) -> str:
        return f"{self.student}'s chat in {self.classroom}"


# --- supervision: the teacher in charge ----------------------------------------------------------


class FlagCategory(models.TextChoices):
    SELF_HARM = "self_harm", _("self-harm")
    VIOLENCE = "violence", _("violence")
    BULLYING = "bullying", _("bullying")
    PERSONAL_DATA = "personal_data", _("personal data")
    TEACHER_WORDS = "teacher_words", _("the teacher's words")
    LLM = "llm", _("model check")


class OnFlag(models.TextChoices):
    NOTICE = "notice", _("Show a notice to the student")
    HOLD = "hold", _("Hold the AI reply until I review it")
    NOTIFY = "notify", _("Only notify me")


def default_flag_categories() -> list[str]:
    return [c for c in FlagCategory.values if c != FlagCategory.LLM]


class Guardrails(models.Model):
    """A class's moderation settings (one row per class, made on first use)."""

    classroom = models.OneToOneField(Classroom, on_delete=models.CASCADE, related_name="guardrails")
    categories = models.JSONField(default=default_flag_categories)
    words = models.TextField(blank=True, help_text="the teacher's own words, one per line")
    on_flag = models.CharField(max_length=8, choices=OnFlag.choices, default=OnFlag.NOTIFY)
    # A model alias for an extra LLM check of each message; empty: rules only.
    check_model = models.CharField(max_length=100, blank=True)

    def __str__(self) -> str:
        return f"guardrails of {self.classroom}"


class Flag(models.Model):
    class Severity(models.IntegerChoices):
        LOW = 1, "low"
        MEDIUM = 2, "medium"
        HIGH = 3, "high"

    class Source(models.TextChoices):
        STUDENT = "student"
        PERSONA = "persona"

    classroom = models.ForeignKey(Classroom, on_delete=models.CASCADE, related_name="flags")
    chat = models.ForeignKey("chat.ChatSession", on_delete=models.CASCADE, related_name="+")
    student = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    source = models.CharField(max_length=8, choices=Source.choices)
    speaker = models.CharField(max_length=100, blank=True)
    seq = models.PositiveIntegerField(default=0)  # the message's display seq
    message = models.TextField()
    category = models.CharField(max_length=16, choices=FlagCategory.choices)
    severity = models.PositiveSmallIntegerField(choices=Severity.choices)
    reason = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["classroom", "reviewed_at"])]

    def __str__(self) -> str:
        return f"{self.get_severity_display()} flag: {self.reason}"


class TeacherView(models.Model):
    """One teacher's look at one student's class chat: the audit the student sees."""

    class How(models.TextChoices):
        PAGE = "page"
        WALL = "wall"
        EXPORT = "export"
        API = "api"
        SOCKET = "socket"  # the chat page's live socket
        ARTIFACT = "artifact"  # an artifact of the chat: page, content, zip

    classroom = models.ForeignKey(Classroom, on_delete=models.CASCADE, related_name="+")
    chat = models.ForeignKey("chat.ChatSession", on_delete=models.CASCADE, related_name="+")
    viewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    how = models.CharField(max_length=8, choices=How.choices)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["chat", "-at"])]

    def __str__(self) -> str:
        return f"{self.viewer} viewed {self.chat_id} ({self.how})"


class HeldInput(models.Model):
    """A student's message kept without a reply (the AI paused, or a flag holds it)."""

    class Reason(models.TextChoices):
        PAUSED = "paused"
        FLAG = "flag"

    chat = models.ForeignKey("chat.ChatSession", on_delete=models.CASCADE, related_name="+")
    queued_input = models.OneToOneField(
        "chat.QueuedInput", on_delete=models.CASCADE, related_name="+"
    )
    reason = models.CharField(max_length=8, choices=Reason.choices)
    flag = models.ForeignKey(
        Flag, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Sent before the pause (the model check, if any, has read it already).
    checked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"input {self.queued_input_id} held ({self.reason})"


class PendingNote(models.Model):
    """A teacher's message written while a reply ran: enters context when the run ends."""

    chat = models.ForeignKey("chat.ChatSession", on_delete=models.CASCADE, related_name="+")
    message = models.JSONField()  # ChatMessage.to_dict() of the context side
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"note for chat {self.chat_id}"
