"""What people can do to a class: one function per action, each owning its effects.

As in :mod:`chat.actions`: access is checked first (``classroom.access``), the writes
happen in one transaction, and doorbells ring after the commit (``chat.live.doorbell``
defers to it). Callers (views, the API) call one action and nothing else.
Errors are :class:`chat.actions.ActionError` with a message for the user.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.translation import gettext as _

from chat import actions as chat_actions
from chat import store
from chat.actions import ActionError, SendCheck, SendResult
from chat.catalog import UnknownModel, available_models, default_model
from chat.core.channels import LiveChannels
from chat.core.eventlog import msg_event
from chat.core.messages import ChatMessage
from chat.live.doorbell import group_send_soon, ring, ring_cancel
from chat.live.layers import live_layer
from chat.models import ChatEvent, ChatSession, QueuedInput, Run
from chat.roles import is_teacher
from chat.runhost import transitions
from classroom import llmcheck, moderation
from classroom.access import (
    ClassAction,
    access_classroom,
    access_co_teacher,
    access_enrollment,
    access_persona,
)
from classroom.access import access_scene as _access_scene
from classroom.models import (
    JOIN_CODE_ALPHABET,
    SCENE_CONTENT_MAX,
    SCENE_CONTEXT_MAX,
    Classroom,
    ClassroomChat,
    Enrollment,
    Flag,
    FlagCategory,
    Guardrails,
    HeldInput,
    OnFlag,
    PendingNote,
    Persona,
    Scene,
    TeacherView,
    new_join_code,
)
from classroom.prompt import build_scene_context, cast_of

TITLE_MAX = 200
PERSONA_NAME = re.compile(r"^[^\W_][\w .'-]{0,39}$")
COLOUR = re.compile(r"^#[0-9a-fA-F]{6}$")
GUARDRAIL_MAX = 2_000
PERSONA_PROMPT_MAX = 4_000

# The cast a new class starts with; the teacher edits it.
PRESET_CAST = [
    {
        "name": "Ada",
        "role": Persona.Role.TEACHER,
        "avatar": "🧑‍🏫",
        "colour": "#7c3aed",
        "prompt": "A warm, patient teacher. Explains one idea at a time, asks guiding "
        "questions, and checks understanding before moving on.",
    },
    {
        "name": "Theo",
        "role": Persona.Role.ASSISTANT,
        "avatar": "🧭",
        "colour": "#0f766e",
        "prompt": "A practical teaching assistant. Gives hints, small worked examples and "
        "reminders of the method, never the final answer.",
    },
    {
        "name": "Maya",
        "role": Persona.Role.STUDENT,
        "avatar": "🙋",
        "colour": "#c2410c",
        "prompt": "A curious classmate. Thinks aloud, asks the questions others do not dare "
        "to ask, and sometimes makes a mistake worth discussing.",
    },
    {
        "name": "Leo",
        "role": Persona.Role.STUDENT,
        "avatar": "🧑‍🎤",
        "colour": "#1d4ed8",
        "prompt": "A confident, brief classmate. Suggests another way to see the problem "
        "and likes concrete examples.",
    },
]


# --- helpers -------------------------------------------------------------------------------------


def _title(text: str, scene: bool = False) -> str:
    text = " ".join((text or "").split())
    if not text:
        raise ActionError(
            _("A scene needs a title.") if scene else _("A class needs a title."), "empty"
        )
    if len(text) > TITLE_MAX:
        raise ActionError(
            _("The title is too long (the limit is %(limit)s characters).") % {"limit": TITLE_MAX},
            "too_long",
        )
    return text


def _checked_model(alias: str, *, allow_empty: bool) -> str:
    alias = (alias or "").strip()
    if not alias:
        if allow_empty:
            return ""
        try:
            return default_model()
        except UnknownModel as exc:
            raise ActionError(str(exc), "unknown_model") from None
    if alias not in {c.alias for c in available_models()}:
        raise ActionError(str(UnknownModel(alias)), "unknown_model")
    return alias


def class_model(classroom: Classroom) -> str:
    """The model of the class's one call: the AI teacher's own, else the class's."""
    cast = cast_of(classroom)
    if cast and cast[0].model:
        return cast[0].model
    return classroom.model


def _sync_chat_models(classroom: Classroom) -> None:
    """Class chats answer with the class's model from their next message on."""
    ChatSession.objects.filter(classroom_link__classroom=classroom).exclude(
        model=class_model(classroom)
    ).update(model=class_model(classroom))


def _clean_code(code: str) -> str:
    return re.sub(r"[\s-]", "", code or "").upper()


# --- classes -------------------------------------------------------------------------------------


def create_classroom(user, *, title: str, subject: str = "", model: str = "") -> Classroom:
    if not is_teacher(user) and not user.is_staff:
        raise ActionError(_("Only teachers can create classes."), "not_found")
    title = _title(title)
    subject = " ".join((subject or "").split())[:200]
    model = _checked_model(model, allow_empty=False)
    with transaction.atomic():
        classroom = Classroom.objects.create(
            title=title, subject=subject, owner=user, model=model, join_code=_unused_code()
        )
        Persona.objects.bulk_create(
            Persona(classroom=classroom, position=index, **preset)
            for index, preset in enumerate(PRESET_CAST)
        )
    return classroom


def _unused_code() -> str:
    while True:
        code = new_join_code()
        if not Classroom.objects.filter(join_code=code).exists():
            return code


def update_classroom(user, classroom_id, *, title: str, subject: str, model: str) -> Classroom:
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    classroom.title = _title(title)
    classroom.subject = " ".join((subject or "").split())[:200]
    classroom.model = _checked_model(model, allow_empty=False)
    with transaction.atomic():
        classroom.save(update_fields=["title", "subject", "model"])
        _sync_chat_models(classroom)
    return classroom


# How long a regenerated code may work (days; None: until regenerated again).
JOIN_CODE_VALIDITY_DAYS = (None, 1, 7, 30)


def regenerate_join_code(user, classroom_id, valid_for_days: int | None = None) -> str:
    """A new join code; the old one stops working at once. With ``valid_for_days`` the
    new one expires then too (a code copied off a board does not work for ever)."""
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    if valid_for_days not in JOIN_CODE_VALIDITY_DAYS:
        raise ActionError(_("Choose how long the code stays valid."), "bad_request")
    classroom.join_code = _unused_code()
    classroom.join_code_expires_at = (
        timezone.now() + timedelta(days=valid_for_days) if valid_for_days else None
    )
    classroom.save(update_fields=["join_code", "join_code_expires_at"])
    return classroom.join_code


def set_archived(user, classroom_id, archived: bool) -> Classroom:
    classroom = access_classroom(user, classroom_id, ClassAction.OWN)
    classroom.archived_at = timezone.now() if archived else None
    classroom.save(update_fields=["archived_at"])
    return classroom


# --- co-teachers ---------------------------------------------------------------------------------


def _find_teacher(who: str):
    """The one active teacher with this username or email, or None (one answer for
    "no such user" and "not a teacher": the form tells nobody who has an account)."""
    who = (who or "").strip()
    if not who:
        return None
    users = get_user_model().objects.filter(is_active=True)
    found = list(users.filter(username__iexact=who)[:2])
    if len(found) != 1 and "@" in who:
        found = list(users.filter(email__iexact=who)[:2])
    if len(found) != 1:
        return None
    user = found[0]
    return user if is_teacher(user) or user.is_staff else None


def add_co_teacher(user, classroom_id, who: str):
    """The owner shares the class with another teacher, found by username or email;
    they run it as the owner does, but do not archive it nor choose co-teachers."""
    classroom = access_classroom(user, classroom_id, ClassAction.OWN)
    if not (who or "").strip():
        raise ActionError(_("Type the username or email of a teacher."), "empty")
    teacher = _find_teacher(who)
    if teacher is None:
        raise ActionError(
            _("No teacher has the username or email “%(who)s”.") % {"who": who.strip()[:100]},
            "not_found",
        )
    name = teacher.get_username()
    if teacher.pk == classroom.owner_id:
        raise ActionError(_("You own this class already."), "duplicate")
    if Enrollment.objects.filter(classroom=classroom, student=teacher).exists():
        raise ActionError(
            _("%(name)s is a student of this class: remove them from the roster first.")
            % {"name": name},
            "conflict",
        )
    with transaction.atomic():
        classroom.co_teachers.add(teacher)  # adding twice is harmless
    return teacher


def remove_co_teacher(user, classroom_id, co_teacher_id) -> str:
    """The owner takes a co-teacher off the class; their open wall loses it at its next
    access check."""
    classroom, co_teacher = access_co_teacher(user, classroom_id, co_teacher_id)
    with transaction.atomic():
        classroom.co_teachers.remove(co_teacher)
        ring_class(classroom.pk, "state")
    return co_teacher.get_username()


# --- roster --------------------------------------------------------------------------------------


def join_classroom(user, code: str) -> Classroom:
    """Enrol ``user`` in the class of ``code``; joining twice is harmless."""
    code = _clean_code(code)
    if not code:
        raise ActionError(_("Type the join code your teacher gave you."), "empty")
    wrong = ActionError(
        _("That join code is wrong or no longer valid. Check it with your teacher."), "bad_code"
    )
    if any(c not in JOIN_CODE_ALPHABET for c in code):
        raise wrong
    classroom = Classroom.objects.filter(join_code=code).first()
    if classroom is None or classroom.archived_at is not None:
        raise wrong
    expires = classroom.join_code_expires_at
    if expires is not None and expires <= timezone.now() and not classroom.is_teacher(user):
        raise ActionError(
            _("That join code has expired. Ask your teacher for a new one."), "expired_code"
        )
    if classroom.is_teacher(user):
        return classroom  # a teacher of the class has it already
    try:
        with transaction.atomic():
            Enrollment.objects.get_or_create(classroom=classroom, student=user)
            ring_class(classroom.pk, "roster")
    except IntegrityError:
        pass  # joined twice at once: the first one won
    return classroom


def remove_student(user, classroom_id, enrollment_id) -> str:
    """Take a student off the roster; their class chat stays theirs, read-only to the class."""
    enrollment = access_enrollment(user, classroom_id, enrollment_id)
    name = enrollment.student.get_username()
    enrollment.delete()
    return name


# --- scenes --------------------------------------------------------------------------------------


def save_scene(
    user,
    classroom_id,
    scene_id=None,
    *,
    title: str,
    kind: str = Scene.Kind.LECTURE,
    content: str = "",
    scene_context: str | None = None,
    guardrail: str | None = None,
) -> Scene:
    """Add a scene (``scene_id`` None) or edit one. An empty ``scene_context`` means
    "build it from the content"; a written one is kept as the teacher wrote it."""
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    if scene_id is None:
        scene = Scene(classroom=classroom)
    else:
        scene = _access_scene(user, classroom.pk, scene_id)
    scene.title = _title(title, scene=True)
    if kind not in Scene.Kind.values:
        raise ActionError(_("Unknown scene kind '%(kind)s'.") % {"kind": kind}, "bad_request")
    scene.kind = kind
    content = (content or "").replace("\r\n", "\n")
    if len(content) > SCENE_CONTENT_MAX:
        raise ActionError(
            _("The scene content is too long (%(length)s characters; the limit is %(limit)s).")
            % {"length": len(content), "limit": SCENE_CONTENT_MAX},
            "too_long",
        )
    scene.content = content
    if guardrail is not None:
        if len(guardrail) > GUARDRAIL_MAX:
            raise ActionError(
                _("The guardrail is too long (the limit is %(limit)s characters).")
                % {"limit": GUARDRAIL_MAX},
                "too_long",
            )
        scene.guardrail = guardrail.strip()
    written = (scene_context or "").strip()
    if len(written) > SCENE_CONTEXT_MAX:
        raise ActionError(
            _("The scene context is too long (%(length)s characters; the limit is %(limit)s).")
            % {"length": len(written), "limit": SCENE_CONTEXT_MAX},
            "too_long",
        )
    if scene_context is not None:
        scene.context_edited = bool(written) and written != build_scene_context(classroom, scene)
    scene.scene_context = written if scene.context_edited else build_scene_context(classroom, scene)
    with transaction.atomic():
        if scene.pk is None:
            last = classroom.scenes.aggregate(m=Max("position"))["m"]
            scene.position = 0 if last is None else last + 1
        scene.save()
        if classroom.current_scene_id is None:
            _move_class_to(classroom, scene)
    return scene


def move_scene(user, classroom_id, scene_id, direction: str) -> None:
    """Move a scene one place "up" or "down" in the class's order."""
    scene = _access_scene(user, classroom_id, scene_id)
    with transaction.atomic():
        scenes = list(Scene.objects.select_for_update().filter(classroom=scene.classroom))
        index = next(i for i, s in enumerate(scenes) if s.pk == scene.pk)
        other = index - 1 if direction == "up" else index + 1
        if direction not in ("up", "down") or not 0 <= other < len(scenes):
            return
        scenes[index], scenes[other] = scenes[other], scenes[index]
        for position, item in enumerate(scenes):
            if item.position != position:
                Scene.objects.filter(pk=item.pk).update(position=position)


def delete_scene(user, classroom_id, scene_id) -> str:
    scene = _access_scene(user, classroom_id, scene_id)
    title = scene.title
    scene.delete()
    return title


def set_current_scene(user, classroom_id, scene_id) -> Scene:
    """Move the class to a scene: every class chat gets its marker; the next prompt uses it."""
    scene = _access_scene(user, classroom_id, scene_id)
    with transaction.atomic():
        classroom = Classroom.objects.select_for_update().get(pk=scene.classroom_id)
        if classroom.current_scene_id != scene.pk:
            _move_class_to(classroom, scene)
            ring_class(classroom.pk, "state")
    return scene


def _scene_marker(scene: Scene) -> dict:
    return {
        "type": "scene",
        "scene_id": scene.pk,
        "number": scene.number,
        "title": scene.title,
        "kind": scene.kind,
    }


def _move_class_to(classroom: Classroom, scene: Scene) -> None:
    """Inside a transaction: set the current scene and mark it in every class chat."""
    classroom.current_scene = scene
    Classroom.objects.filter(pk=classroom.pk).update(current_scene=scene)
    marker = _scene_marker(scene)
    for chat_id in ClassroomChat.objects.filter(classroom=classroom).values_list(
        "chat_id", flat=True
    ):
        ring(chat_id, store.append_display(chat_id, [dict(marker)]))


# --- personas ------------------------------------------------------------------------------------


def save_persona(
    user,
    classroom_id,
    persona_id=None,
    *,
    name: str,
    role: str,
    prompt: str = "",
    avatar: str = "",
    colour: str = "",
    model: str = "",
    enabled: bool = True,
) -> Persona:
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    persona = (
        Persona(classroom=classroom)
        if persona_id is None
        else access_persona(user, classroom.pk, persona_id)
    )
    name = " ".join((name or "").split())
    if not name:
        raise ActionError(_("A persona needs a name."), "empty")
    if not PERSONA_NAME.match(name):
        raise ActionError(
            _(
                "A persona's name is up to 40 letters, digits, spaces, dots, hyphens or "
                "apostrophes, starting with a letter or digit."
            ),
            "bad_name",
        )
    clash = classroom.personas.filter(name__iexact=name).exclude(pk=persona.pk).exists()
    if clash:
        raise ActionError(
            _("The class already has a persona named %(name)s.") % {"name": name}, "duplicate"
        )
    if role not in Persona.Role.values:
        raise ActionError(_("Unknown persona role '%(role)s'.") % {"role": role}, "bad_request")
    if len(prompt or "") > PERSONA_PROMPT_MAX:
        raise ActionError(
            _("The persona prompt is too long (the limit is %(limit)s characters).")
            % {"limit": PERSONA_PROMPT_MAX},
            "too_long",
        )
    colour = (colour or "").strip() or persona.colour
    if not COLOUR.match(colour):
        raise ActionError(_("A colour is written #rrggbb, for example #7c3aed."), "bad_colour")
    persona.name, persona.role, persona.prompt = name, role, (prompt or "").strip()
    persona.avatar = (avatar or "").strip()[:16] or persona.avatar
    persona.colour = colour.lower()
    persona.model = _checked_model(model, allow_empty=True)
    persona.enabled = bool(enabled)
    with transaction.atomic():
        if persona.pk is None:
            last = classroom.personas.aggregate(m=Max("position"))["m"]
            persona.position = 0 if last is None else last + 1
        try:
            with transaction.atomic():
                persona.save()
        except IntegrityError:
            raise ActionError(
                _("The class already has a persona named %(name)s.") % {"name": name}, "duplicate"
            ) from None
        _sync_chat_models(classroom)
    return persona


def delete_persona(user, classroom_id, persona_id) -> str:
    persona = access_persona(user, classroom_id, persona_id)
    name = persona.name
    with transaction.atomic():
        persona.delete()
        _sync_chat_models(persona.classroom)
    return name


# --- the student's class chat --------------------------------------------------------------------


def open_class_chat(user, classroom_id) -> ClassroomChat:
    """The user's chat of the class, made on first use (with the current scene's marker)."""
    classroom = access_classroom(user, classroom_id, ClassAction.STUDY)
    link = (
        ClassroomChat.objects.select_related("chat").filter(classroom=classroom, student=user)
    ).first()
    if link is not None:
        link.classroom = classroom
        return link
    try:
        with transaction.atomic():
            chat = store.create_chat(user, title=classroom.title, model=class_model(classroom))
            ChatSession.objects.filter(pk=chat.pk).update(kind=ChatSession.Kind.CLASSROOM)
            chat.kind = ChatSession.Kind.CLASSROOM
            link = ClassroomChat.objects.create(classroom=classroom, student=user, chat=chat)
            if classroom.current_scene is not None:
                store.append_display(chat.pk, [_scene_marker(classroom.current_scene)])
            ring_class(classroom.pk, "roster")
    except IntegrityError:  # opened twice at once: the first one made it
        link = ClassroomChat.objects.select_related("chat").get(classroom=classroom, student=user)
    link.classroom = classroom
    return link


def send_class_message(
    user, classroom_id, text: str, client_id: str, *, scene_context: str | None = None
) -> tuple[ClassroomChat, SendResult]:
    """The API's send: into the user's class chat (made if need be), one run per call.

    ``scene_context`` (seed 001's optional field) is what the client shows the student;
    it goes into the prompts of this class chat until the next call says otherwise.
    """
    link = open_class_chat(user, classroom_id)
    given = (scene_context or "").strip()[:SCENE_CONTEXT_MAX]
    if given != link.client_scene_context:
        ClassroomChat.objects.filter(pk=link.pk).update(client_scene_context=given)
        link.client_scene_context = given
    return link, chat_actions.send_message(user, link.chat_id, text, client_id)


# --- the teacher in charge: supervision ----------------------------------------------------------

PAUSED_NOTICE = (
    "Your teacher has paused the AI. Your message is kept and will be answered when the AI is back."
)
PAUSE_NOTE = "Your teacher has paused the AI for the class."
RESUME_NOTE = "Your teacher has resumed the AI."
FLAG_NOTICE = "This message was flagged for your teacher to read."
HOLD_NOTICE = "This message was flagged: the AI will answer once your teacher has read it."
REPLY_FLAG_NOTICE = "A reply was flagged for your teacher to check."


def class_group(classroom_id) -> str:
    """The wall's group: roster, flag and class-state changes of one class."""
    return f"class.{classroom_id}"


def ring_class(classroom_id, kind: str, **fields) -> None:
    """After the commit, tell the class's walls (``kind``: roster, flags, state)."""
    layer = live_layer()
    if layer is None:
        return
    message = {"type": f"class.{kind}", "classroom_id": int(classroom_id), **fields}
    transaction.on_commit(lambda: group_send_soon(layer, class_group(classroom_id), message))


def guardrails_of(classroom: Classroom) -> Guardrails:
    guardrails, _created = Guardrails.objects.get_or_create(classroom=classroom)
    return guardrails


def _link_and_guardrails(chat_id) -> tuple[ClassroomChat, Guardrails] | None:
    """A class chat's link with its class and the class's guardrails, in one query:
    every student message and every run's end needs them."""
    query = ClassroomChat.objects.select_related("classroom__guardrails")
    link = query.filter(chat_id=chat_id).first()
    if link is None:
        return None
    try:
        return link, link.classroom.guardrails
    except Guardrails.DoesNotExist:  # made on first use
        return link, guardrails_of(link.classroom)


def save_guardrails(
    user, classroom_id, *, categories: list[str], words: str, on_flag: str, check_model: str = ""
) -> Guardrails:
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    if on_flag not in OnFlag.values:
        raise ActionError(_("Unknown setting '%(value)s'.") % {"value": on_flag}, "bad_request")
    unknown = set(categories) - set(FlagCategory.values)
    if unknown:
        raise ActionError(
            _("Unknown categories: %(names)s.") % {"names": ", ".join(sorted(unknown))},
            "bad_request",
        )
    guardrails = guardrails_of(classroom)
    guardrails.categories = [c for c in FlagCategory.values if c in categories]
    guardrails.words = "\n".join(moderation.teacher_words(words))
    guardrails.on_flag = on_flag
    guardrails.check_model = _checked_model(check_model, allow_empty=True)
    guardrails.save()
    return guardrails


def _teacher_name(user) -> str:
    name = " ".join((user.get_full_name() or user.get_username()).split())
    return re.sub(r"[<>/]", "", name)[:60] or "Teacher"


def _flag(
    link: ClassroomChat, guardrails: Guardrails, source: str, speaker: str, seq: int, text: str
):
    hits = moderation.check(text, guardrails.categories, moderation.teacher_words(guardrails.words))
    flags = [
        Flag.objects.create(
            classroom_id=link.classroom_id,
            chat_id=link.chat_id,
            student_id=link.student_id,
            source=source,
            speaker=speaker,
            seq=seq,
            message=text[:4000],
            category=hit.category,
            severity=hit.severity,
            reason=hit.reason[:300],
        )
        for hit in hits
    ]
    if flags:
        ring_class(link.classroom_id, "flags", chat_id=str(link.chat_id))
    return flags


def _model_check(
    link: ClassroomChat, guardrails: Guardrails, source: str, speaker: str, seq: int, text: str
) -> None:
    """The class's optional model check of one message, after the commit, off the chat."""
    if guardrails.check_model:
        llmcheck.check_on_commit(
            llmcheck.Job(
                guardrails.check_model,
                link.classroom_id,
                str(link.chat_id),
                link.student_id,
                source,
                speaker,
                seq,
                text,
            )
        )


def class_send_check(chat: ChatSession, entry: QueuedInput) -> SendCheck | None:
    """Registered with chat: every student message of a class chat passes here (in the
    send's transaction): held while the AI is paused, moderated, the wall told."""
    found = _link_and_guardrails(chat.pk)
    if found is None:
        return None
    link, guardrails = found
    classroom = link.classroom
    flags = _flag(link, guardrails, Flag.Source.STUDENT, "", entry.display_seq or 0, entry.content)
    ring_class(classroom.pk, "activity", chat_id=str(chat.pk))
    checked = SendCheck()
    if not classroom.ai_paused:  # no model call while paused: checked on resume
        seq = entry.display_seq or 0
        _model_check(link, guardrails, Flag.Source.STUDENT, "", seq, entry.content)
    if classroom.ai_paused:
        HeldInput.objects.create(chat=chat, queued_input=entry, reason=HeldInput.Reason.PAUSED)
        checked.hold = True
        checked.notices.append(PAUSED_NOTICE)
    elif flags and guardrails.on_flag == OnFlag.HOLD:
        HeldInput.objects.create(
            chat=chat, queued_input=entry, reason=HeldInput.Reason.FLAG, flag=flags[0]
        )
        checked.hold = True
        checked.notices.append(HOLD_NOTICE)
    elif flags and guardrails.on_flag == OnFlag.NOTICE:
        checked.notices.append(FLAG_NOTICE)
    return checked


def class_run_finished(run: Run, status: str) -> None:
    """Registered with chat: a class chat's run ended (inside its transaction).

    A teacher's message written while the run was live enters the context now, after
    the run's own; the replies the run wrote are moderated.
    """
    found = _link_and_guardrails(run.chat_id)
    if found is None:
        return
    link, guardrails = found
    notes = list(PendingNote.objects.filter(chat_id=run.chat_id).order_by("pk"))
    if notes:
        stamp = store.now_ms()
        store.append_events(
            run.chat_id,
            store.SESSION,
            [msg_event(ChatMessage.from_dict(n.message), stamp) for n in notes],
        )
        PendingNote.objects.filter(pk__in=[n.pk for n in notes]).delete()
    replies = ChatEvent.objects.filter(
        chat_id=run.chat_id,
        channel=ChatEvent.Channel.DISPLAY,
        kind="msg",
        payload__role="assistant",
        payload__extra__run_id=str(run.pk),
    ).values_list("seq", "payload")
    flagged = False
    for seq, payload in replies:
        text = str(payload.get("content") or "")
        speaker = str(payload.get("sender_name") or "")
        flagged |= bool(_flag(link, guardrails, Flag.Source.PERSONA, speaker, seq, text))
        _model_check(link, guardrails, Flag.Source.PERSONA, speaker, seq, text)
    if flagged and guardrails.on_flag != OnFlag.NOTIFY:
        note = ChatMessage(role="system", content=REPLY_FLAG_NOTICE)
        ring(run.chat_id, store.append_display_messages(run.chat_id, [note]))
    ring_class(link.classroom_id, "activity", chat_id=str(run.chat_id))


def _links(classroom: Classroom):
    return ClassroomChat.objects.filter(classroom=classroom).select_related("student")


def _link_of(classroom: Classroom, student_id) -> ClassroomChat:
    link = _links(classroom).filter(student_id=student_id).first()
    if link is None:
        raise ActionError(_("That student has not opened the class chat yet."), "not_found")
    link.classroom = classroom
    return link


def _write_teacher_note(chat_id, teacher, text: str) -> int:
    """Inside a transaction: the teacher's labelled message, clean in display, wrapped in
    context (``LiveChannels.push_labelled``); held for the run's end while one is live."""
    channels = LiveChannels()
    channels.push_labelled(
        ChatMessage(
            role="user",
            content=text,
            sender_name=_teacher_name(teacher),
            extra={"teacher": True, "teacher_id": teacher.pk},
        )
    )
    rows = store.append_display_messages(chat_id, channels.display)
    chat = ChatSession.objects.get(pk=chat_id)
    if transitions.live_run(chat, lock=True) is not None:
        PendingNote.objects.bulk_create(
            PendingNote(chat_id=chat_id, message=m.to_dict()) for m in channels.context
        )
    else:
        stamp = store.now_ms()
        store.append_events(chat_id, store.SESSION, [msg_event(m, stamp) for m in channels.context])
    ring(chat_id, rows)
    return rows[0].seq


def step_in(user, classroom_id, student_id, text: str) -> int:
    """The teacher writes into one student's class chat; the personas see it next turn."""
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    text = chat_actions._checked_text(text)
    link = _link_of(classroom, student_id)
    with transaction.atomic():
        seq = _write_teacher_note(link.chat_id, user, text)
        ring_class(classroom.pk, "activity", chat_id=str(link.chat_id))
    return seq


def broadcast(user, classroom_id, text: str) -> int:
    """One teacher message into every student's class chat; how many it reached."""
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    text = chat_actions._checked_text(text)
    chat_ids = list(_links(classroom).values_list("chat_id", flat=True))
    with transaction.atomic():
        for chat_id in chat_ids:
            _write_teacher_note(chat_id, user, text)
    return len(chat_ids)


def _note_all(classroom: Classroom, text: str) -> list[ChatSession]:
    chats = list(ChatSession.objects.filter(classroom_link__classroom=classroom))
    note = ChatMessage(role="system", content=text)
    for chat in chats:
        ring(chat.pk, store.append_display_messages(chat.pk, [note]))
    return chats


def pause_ai(user, classroom_id) -> Classroom:
    """No LLM call for the class until resumed; running replies stop, keeping their text."""
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    with transaction.atomic():
        classroom = Classroom.objects.select_for_update().get(pk=classroom.pk)
        if classroom.ai_paused:
            return classroom
        Classroom.objects.filter(pk=classroom.pk).update(ai_paused=True)
        classroom.ai_paused = True
        for chat in _note_all(classroom, PAUSE_NOTE):
            run = transitions.live_run(chat, lock=True)
            if run is None:
                continue
            _hold_untaken(chat)
            if run.status == Run.Status.WAITING or not run.claimed:
                # Nothing executes it yet (a run not claimed waits for a task or a
                # worker; the claim needs the row this transaction holds): it ends here.
                transitions.finish_waiting_run_cancelled(run)
                continue
            Run.objects.filter(pk=run.pk).update(cancel_requested=True)
            ring_cancel(run.pk)
        ring_class(classroom.pk, "state")
    return classroom


def _hold_untaken(chat: ChatSession) -> None:
    """Inside pause_ai's transaction: the messages no run has taken yet (the one that
    started a run not yet under way, those queued behind a reply) are held for the
    resume, so stopping the run does not leave them unanswered, nor start another run."""
    untaken = list(
        QueuedInput.objects.select_for_update().filter(chat=chat, consumed=False).order_by("pk")
    )
    if not untaken:
        return
    QueuedInput.objects.filter(pk__in=[q.pk for q in untaken]).update(consumed=True, run=None)
    HeldInput.objects.bulk_create(
        HeldInput(chat=chat, queued_input=q, reason=HeldInput.Reason.PAUSED, checked=True)
        for q in untaken
    )


def _release(held: list[HeldInput]) -> None:
    """Inside a transaction: held messages go back to the queue; their runs start on commit."""
    if not held:
        return
    QueuedInput.objects.filter(pk__in=[h.queued_input_id for h in held]).update(consumed=False)
    HeldInput.objects.filter(pk__in=[h.pk for h in held]).delete()
    for chat in ChatSession.objects.filter(pk__in={h.chat_id for h in held}):
        transaction.on_commit(functools.partial(chat_actions.launch_next_queued, chat))


def _check_held(classroom: Classroom, held: list[HeldInput]) -> None:
    """The model check of the messages written while the AI was paused (none was made)."""
    guardrails = guardrails_of(classroom)
    if not guardrails.check_model or not held:
        return
    links = {link.chat_id: link for link in _links(classroom)}
    for item in held:
        link = links.get(item.chat_id)
        if link is not None and not item.checked:
            entry = item.queued_input
            seq = entry.display_seq or 0
            _model_check(link, guardrails, Flag.Source.STUDENT, "", seq, entry.content)


def resume_ai(user, classroom_id) -> Classroom:
    """The AI is back: each student's message kept meanwhile is answered."""
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    with transaction.atomic():
        classroom = Classroom.objects.select_for_update().get(pk=classroom.pk)
        if not classroom.ai_paused:
            return classroom
        Classroom.objects.filter(pk=classroom.pk).update(ai_paused=False)
        classroom.ai_paused = False
        _note_all(classroom, RESUME_NOTE)
        held = list(
            HeldInput.objects.filter(
                chat__classroom_link__classroom=classroom, reason=HeldInput.Reason.PAUSED
            ).select_related("queued_input")
        )
        _check_held(classroom, held)
        _release(held)
        ring_class(classroom.pk, "state")
    return classroom


def review_flag(user, classroom_id, flag_id) -> Flag:
    """The teacher has read a flag; a reply it held is released (unless the AI is paused)."""
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    with transaction.atomic():
        flag = Flag.objects.select_for_update().filter(pk=flag_id, classroom=classroom).first()
        if flag is None:
            raise ActionError(_("No such flag."), "not_found")
        if flag.reviewed_at is None:
            flag.reviewed_at, flag.reviewed_by = timezone.now(), user
            flag.save(update_fields=["reviewed_at", "reviewed_by"])
        held = HeldInput.objects.filter(flag=flag, reason=HeldInput.Reason.FLAG)
        if classroom.ai_paused:
            held.update(reason=HeldInput.Reason.PAUSED, checked=True)  # answered on resume
        else:
            _release(list(held))
        ring_class(classroom.pk, "flags", chat_id=str(flag.chat_id))
    return flag


def observe_view(user, chat: ChatSession, how: str) -> None:
    """Registered with chat (``note_view``): a read of a class chat by anyone but its
    student (a teacher, through the chat page, its socket, an export, the API or an
    artifact) is recorded like the wall's and the class pages' own reads."""
    if chat.kind != ChatSession.Kind.CLASSROOM:
        return
    link = ClassroomChat.objects.select_related("classroom").filter(chat_id=chat.pk).first()
    if link is None:
        return
    how = how if how in TeacherView.How.values else TeacherView.How.PAGE
    record_views(user, link.classroom, [chat.pk], how)


def record_views(user, classroom: Classroom, chat_ids, how: str) -> None:
    """The audit of a teacher looking at students' class chats (the student sees it)."""
    TeacherView.objects.bulk_create(
        TeacherView(classroom=classroom, chat_id=chat_id, viewer=user, how=how)
        for chat_id in chat_ids
    )
