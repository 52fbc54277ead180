"""Beside a class chat: the current scene (title, kind, content) and the cast.

Rendered on the page, and pushed out of band with every scene marker (registered with
chat's fragments in ``classroom.apps``), so an open page follows the class to its new
scene; a page resyncing from the log gets them with the marker too.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from chat.presentation.markdown import HtmlCache, render_markdown_uncached
from chat.store import StoredEvent
from classroom.models import Classroom, ClassroomChat, Persona, Scene
from classroom.prompt import cast_of

# A marker goes to every class chat at once: the scene's content is rendered once.
_scene_html = HtmlCache(16)


def scene_html(scene: Scene | None) -> SafeString:
    if scene is None or not scene.content.strip():
        return mark_safe("")
    html = _scene_html.get(scene.content)
    if html is None:
        html = render_markdown_uncached(scene.content)
        _scene_html.put(scene.content, html)
    return mark_safe(html)  # noqa: S308 - sanitised markdown


def cast_version(cast: list[Persona]) -> str:
    """Changes with the cast's names and colours: the cast stylesheet's URL carries it."""
    text = "\n".join(f"{p.pk}:{p.name}:{p.colour}" for p in cast)
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:10]


def side_context(classroom: Classroom) -> dict:
    """What the scene panel and the cast templates need."""
    scene = classroom.current_scene
    cast = cast_of(classroom)
    return {
        "classroom": classroom,
        "scene": scene,
        "scene_html": scene_html(scene),
        "cast": cast,
        "cast_version": cast_version(cast),
    }


def scene_marker_fragments(chat_id: Any, event: StoredEvent) -> str:
    """Registered with chat for ``scene`` events: the panel and the cast as they are now."""
    link = (
        ClassroomChat.objects.select_related("classroom__current_scene")
        .filter(chat_id=chat_id)
        .first()
    )
    if link is None:
        return ""
    context = {"oob": True, **side_context(link.classroom)}
    return "".join(
        render_to_string(template, context)
        for template in (
            "classroom/_scene_panel.html",
            "classroom/_cast.html",
            "classroom/_cast_css.html",
        )
    )
