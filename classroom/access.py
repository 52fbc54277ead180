"""Fetch-with-permission for classroom objects: one helper per object type.

Pages, sockets and the API all fetch through these; anything a user may not see is a
404, exactly like an object that does not exist. A class is seen by its teachers
(owner and co-teachers) and by its enrolled students; only its teachers change it.
An archived class is hidden from students.
"""

from __future__ import annotations

from enum import StrEnum

from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404

from chat.access import ChatAction
from chat.models import ChatSession
from classroom.models import Classroom, ClassroomChat, Enrollment, Persona, Scene


class ClassAction(StrEnum):
    STUDY = "study"  # see the class, its current scene and cast; chat in it
    TEACH = "teach"  # change it: scenes, personas, roster, settings


def _active(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def teaches(user, classroom: Classroom) -> bool:
    return _active(user) and classroom.is_teacher(user)


def studies(user, classroom: Classroom) -> bool:
    return (
        _active(user)
        and classroom.archived_at is None
        and Enrollment.objects.filter(classroom=classroom, student=user).exists()
    )


def can_access_classroom(user, classroom: Classroom, action: ClassAction) -> bool:
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
