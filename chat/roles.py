"""Roles: student (everyone), teacher (group ``Teachers``), admin (staff)."""

from __future__ import annotations

from enum import StrEnum

from django.utils.translation import gettext_lazy as _

TEACHERS_GROUP = "Teachers"


class Role(StrEnum):
    STUDENT = "student"
    TEACHER = "teacher"
    ADMIN = "admin"


# What the header's badge says (the class names stay the values).
ROLE_LABELS = {Role.STUDENT: _("student"), Role.TEACHER: _("teacher"), Role.ADMIN: _("admin")}


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
