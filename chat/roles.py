"""Roles: student (everyone), teacher (group ``Teachers``), admin (staff)."""

from __future__ import annotations

from enum import StrEnum

TEACHERS_GROUP = "Teachers"


class Role(StrEnum):
    STUDENT = "student"
    TEACHER = "teacher"
    ADMIN = "admin"


def role_of(user) -> Role:
    if user.is_staff or user.is_superuser:
        return Role.ADMIN
    if is_teacher(user):
        return Role.TEACHER
    return Role.STUDENT


def is_teacher(user) -> bool:
    if not user.is_authenticated:
        return False
    cached = getattr(user, "_lyceum_is_teacher", None)
    if cached is None:
        cached = user.groups.filter(name=TEACHERS_GROUP).exists()
        user._lyceum_is_teacher = cached
    return cached
