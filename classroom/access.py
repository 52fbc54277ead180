"""Fetch-with-permission for classroom objects: one helper per object type.

Pages, sockets and the API all fetch through these; anything a user may not see is a
404, exactly like an object that does not exist. Who may do what is
:class:`ClassAction`'s table: students study, teachers (the owner and co-teachers)
run the class, and only the owner archives it or chooses its co-teachers. An archived
class is hidden from students.
"""

from __future__ import annotations

from enum import StrEnum

from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db.models import Q
from django.http import Http404

from chat.access import ChatAction
from chat.models import ChatSession
from classroom.models import Classroom, ClassroomChat, Enrollment, Persona, Scene


class ClassAction(StrEnum):
    """What someone does with a class; each level includes the ones above it.

    ========  ==========================================================  ==================
    action    what                                                        who
    ========  ==========================================================  ==================
    STUDY     see the class, its current scene and cast; chat in it       enrolled students
                                                                          (not archived),
                                                                          its teachers
    TEACH     run it: scenes, personas, roster and join code, title and   the owner and the
              model, the wall (watch, step in, pause, flags), exports     co-teachers
    OWN       archive or reopen it; add and remove co-teachers            the owner only
    ========  ==========================================================  ==================
    """

    STUDY = "study"
    TEACH = "teach"
    OWN = "own"


def _active(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def teaches(user, classroom: Classroom) -> bool:
    return _active(user) and classroom.is_teacher(user)


def owns(user, classroom: Classroom) -> bool:
    return _active(user) and classroom.owner_id == user.pk


def studies(user, classroom: Classroom) -> bool:
    return (
        _active(user)
        and classroom.archived_at is None
        and Enrollment.objects.filter(classroom=classroom, student=user).exists()
    )


def can_access_classroom(user, classroom: Classroom, action: ClassAction) -> bool:
    if action == ClassAction.OWN:
        return owns(user, classroom)
    if teaches(user, classroom):
        return True
    return action == ClassAction.STUDY and studies(user, classroom)


def _get(model, pk, **related):
    try:
        return model.objects.select_related(*related.get("with", ())).get(pk=pk)
    except (model.DoesNotExist, ValidationError, ValueError, TypeError):
        raise Http404("Not found") from None


def access_classroom(user, classroom_id, action: ClassAction = ClassAction.STUDY) -> Classroom:
    classroom = _get(Classroom, classroom_id, **{"with": ("owner", "current_scene")})
    if not can_access_classroom(user, classroom, action):
        raise Http404("No such class")
    return classroom


def access_scene(user, classroom_id, scene_id, action: ClassAction = ClassAction.TEACH) -> Scene:
    classroom = access_classroom(user, classroom_id, action)
    scene = _get(Scene, scene_id)
    if scene.classroom_id != classroom.pk:
        raise Http404("No such scene")
    scene.classroom = classroom
    return scene


def access_persona(user, classroom_id, persona_id) -> Persona:
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    persona = _get(Persona, persona_id)
    if persona.classroom_id != classroom.pk:
        raise Http404("No such persona")
    persona.classroom = classroom
    return persona


def access_enrollment(user, classroom_id, enrollment_id) -> Enrollment:
    classroom = access_classroom(user, classroom_id, ClassAction.TEACH)
    enrollment = _get(Enrollment, enrollment_id, **{"with": ("student",)})
    if enrollment.classroom_id != classroom.pk:
        raise Http404("No such student")
    enrollment.classroom = classroom
    return enrollment


def access_co_teacher(user, classroom_id, co_teacher_id):
    """A co-teacher of the class (a user), for its owner to remove."""
    classroom = access_classroom(user, classroom_id, ClassAction.OWN)
    try:
        co_teacher = classroom.co_teachers.get(pk=co_teacher_id)
    except (ObjectDoesNotExist, ValidationError, ValueError, TypeError):
        raise Http404("No such co-teacher") from None
    return classroom, co_teacher


def classrooms_of(user):
    """The classes ``user`` teaches or (not archived) studies in."""
    if not _active(user):
        return Classroom.objects.none()
    return (
        Classroom.objects.filter(
            Q(owner=user)
            | Q(co_teachers=user)
            | Q(enrollments__student=user, archived_at__isnull=True)
        )
        .distinct()
        .select_related("owner")
    )


def teacher_policy(user, chat: ChatSession, action: ChatAction) -> bool:
    """Chat policy: a class's teachers may watch (VIEW) its students' class chats."""
    if action != ChatAction.VIEW or chat.kind != ChatSession.Kind.CLASSROOM:
        return False
    return ClassroomChat.objects.filter(
        Q(classroom__owner=user) | Q(classroom__co_teachers=user), chat_id=chat.pk
    ).exists()


def student_limit(user, chat: ChatSession, action: ChatAction) -> bool:
    """Owner limit of class chats: the student writes only while enrolled in a class that
    is not archived; reading their own chat stays theirs. Nobody renames or deletes one."""
    if action == ChatAction.VIEW:
        return True
    if action == ChatAction.MANAGE:
        return False
    return ClassroomChat.objects.filter(
        chat_id=chat.pk,
        classroom__archived_at__isnull=True,
        classroom__enrollments__student=user,
    ).exists()
