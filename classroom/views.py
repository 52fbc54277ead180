"""The classroom pages: thin views that fetch with permission, call one action, render."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import Count, Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from chat.access import ChatAction, can_access_chat
from chat.actions import ActionError
from chat.catalog import available_models
from chat.presentation.markdown import render_markdown_uncached
from chat.presentation.pages import page_of_items, resume_seq
from chat.roles import is_teacher
from chat.runhost import transitions
from chat.views import _stream_html
from classroom import actions, exports, panels, wall
from classroom.access import (
    ClassAction,
    access_classroom,
    access_persona,
    access_scene,
    classrooms_of,
    owns,
    teaches,
)
from classroom.models import (
    SCENE_CONTENT_MAX,
    ClassroomChat,
    FlagCategory,
    OnFlag,
    Persona,
    Scene,
    TeacherView,
)


def _may_create(user) -> bool:
    return is_teacher(user) or user.is_staff


@require_GET
def class_list(request: HttpRequest) -> HttpResponse:
    classes = list(classrooms_of(request.user))
    taught = [c for c in classes if teaches(request.user, c)]
    studied = [c for c in classes if c not in taught]
    return render(
        request,
        "classroom/list.html",
        {"taught": taught, "studied": studied, "may_create": _may_create(request.user)},
    )


@require_http_methods(["GET", "POST"])
def class_new(request: HttpRequest) -> HttpResponse:
    if not _may_create(request.user):
        raise Http404("Only teachers create classes")
    form = {"title": "", "subject": "", "model": ""}
    if request.method == "POST":
        form = {k: request.POST.get(k, "") for k in form}
        try:
            classroom = actions.create_classroom(request.user, **form)
        except ActionError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, _("Created “%(title)s”.") % {"title": classroom.title})
            return redirect("class_detail", classroom_id=classroom.pk)
    return render(request, "classroom/new.html", {"form": form, "models": available_models()})


@require_GET
def class_detail(request: HttpRequest, classroom_id: int) -> HttpResponse:
    classroom = access_classroom(request.user, classroom_id, ClassAction.STUDY)
    if not teaches(request.user, classroom):
        return redirect("class_chat", classroom_id=classroom.pk)
    return render(
        request,
        "classroom/detail.html",
        {
            "classroom": classroom,
            "scenes": list(classroom.scenes.all()),
            "personas": list(classroom.personas.all()),
            "enrollments": list(classroom.enrollments.select_related("student")),
            "models": available_models(),
            "join_url": request.build_absolute_uri(f"/classes/join/{classroom.join_code}/"),
            "role_choices": Persona.Role.choices,
            "is_owner": owns(request.user, classroom),
            "code_expired": classroom.join_code_expires_at is not None
            and classroom.join_code_expires_at <= timezone.now(),
            "validity_days": [d for d in actions.JOIN_CODE_VALIDITY_DAYS if d],
            "co_teachers": list(classroom.co_teachers.order_by("username")),
        },
    )


def _back(classroom_id, section: str = "") -> HttpResponse:
    response = redirect("class_detail", classroom_id=classroom_id)
    if section:
        response["Location"] += f"#{section}"
    return response


def _do(request: HttpRequest, action, *args, success: str = "", **kwargs):
    """Call one action; report its error (or ``success``) as a flash message."""
    try:
        result = action(request.user, *args, **kwargs)
    except ActionError as exc:
        messages.error(request, exc.message)
        return None
    if success:
        messages.success(request, success.format(result=result))
    return result


@require_POST
def class_settings(request: HttpRequest, classroom_id: int) -> HttpResponse:
    _do(
        request,
        actions.update_classroom,
        classroom_id,
        title=request.POST.get("title", ""),
        subject=request.POST.get("subject", ""),
        model=request.POST.get("model", ""),
        success=_("Saved."),
    )
    return _back(classroom_id)


@require_POST
def class_archive(request: HttpRequest, classroom_id: int) -> HttpResponse:
    archive = request.POST.get("archive") == "1"
    done = (
        _("Archived: students no longer see the class.")
        if archive
        else _("The class is open again.")
    )
    _do(request, actions.set_archived, classroom_id, archive, success=done)
    return _back(classroom_id, "settings")


@require_POST
def class_code(request: HttpRequest, classroom_id: int) -> HttpResponse:
    raw = request.POST.get("valid_for", "")
    try:
        valid_for = int(raw) if raw else None
    except ValueError:
        valid_for = -1  # the action refuses it with a message
    _do(
        request,
        actions.regenerate_join_code,
        classroom_id,
        valid_for,
        success=_("New join code: {result}."),
    )
    return _back(classroom_id, "roster")


@require_POST
def class_remove_student(request: HttpRequest, classroom_id: int, enrollment_id: int):
    _do(
        request,
        actions.remove_student,
        classroom_id,
        enrollment_id,
        success=_("Removed {result} from the class."),
    )
    return _back(classroom_id, "roster")


@require_POST
def class_co_teacher_add(request: HttpRequest, classroom_id: int) -> HttpResponse:
    added = _do(request, actions.add_co_teacher, classroom_id, request.POST.get("who", ""))
    if added is not None:
        messages.success(
            request,
            _("%(name)s now co-teaches this class.") % {"name": added.get_username()},
        )
    return _back(classroom_id, "co-teachers")


@require_POST
def class_co_teacher_remove(request: HttpRequest, classroom_id: int, user_id: int):
    removed = _do(request, actions.remove_co_teacher, classroom_id, user_id)
    if removed is not None:
        messages.success(
            request, _("%(name)s no longer co-teaches this class.") % {"name": removed}
        )
    return _back(classroom_id, "co-teachers")


# --- joining -------------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
def class_join(request: HttpRequest, code: str = "") -> HttpResponse:
    if request.method == "POST":
        classroom = _do(request, actions.join_classroom, request.POST.get("code", ""))
        if classroom is not None:
            return redirect("class_chat", classroom_id=classroom.pk)
        code = request.POST.get("code", "")
    return render(request, "classroom/join.html", {"code": code})


# --- scenes --------------------------------------------------------------------------------------


def _scene_fields(request: HttpRequest) -> dict:
    return {
        "title": request.POST.get("title", ""),
        "kind": request.POST.get("kind", Scene.Kind.LECTURE),
        "content": request.POST.get("content", ""),
        "scene_context": request.POST.get("scene_context", ""),
        "guardrail": request.POST.get("guardrail", ""),
    }


@require_http_methods(["GET", "POST"])
def scene_edit(request: HttpRequest, classroom_id: int, scene_id: int | None = None):
    classroom = access_classroom(request.user, classroom_id, ClassAction.TEACH)
    scene = access_scene(request.user, classroom.pk, scene_id) if scene_id else None
    if request.method == "POST":
        fields = _scene_fields(request)
        saved = _do(request, actions.save_scene, classroom.pk, scene_id, **fields)
        if saved is not None:
            messages.success(request, _("Saved the scene “%(title)s”.") % {"title": saved.title})
            return _back(classroom.pk, "scenes")
        form = fields
    elif scene is not None:
        form = {
            "title": scene.title,
            "kind": scene.kind,
            "content": scene.content,
            "scene_context": scene.scene_context,
            "guardrail": scene.guardrail,
        }
    else:
        form = {
            "title": "",
            "kind": "lecture",
            "content": "",
            "scene_context": "",
            "guardrail": Scene._meta.get_field("guardrail").default,
        }
    return render(
        request,
        "classroom/scene_edit.html",
        {
            "classroom": classroom,
            "scene": scene,
            "form": form,
            "kinds": Scene.Kind.choices,
            "content_max": SCENE_CONTENT_MAX,
        },
    )


@require_POST
def scene_preview(request: HttpRequest, classroom_id: int) -> HttpResponse:
    access_classroom(request.user, classroom_id, ClassAction.TEACH)
    content = request.POST.get("content", "")[:SCENE_CONTENT_MAX]
    html = render_markdown_uncached(content) if content.strip() else ""
    return HttpResponse(
        render_to_string("classroom/_preview.html", {"html": html}), content_type="text/html"
    )


@require_POST
def scene_move(request: HttpRequest, classroom_id: int, scene_id: int) -> HttpResponse:
    _do(request, actions.move_scene, classroom_id, scene_id, request.POST.get("direction", ""))
    return _back(classroom_id, "scenes")


@require_POST
def scene_current(request: HttpRequest, classroom_id: int, scene_id: int) -> HttpResponse:
    _do(
        request,
        actions.set_current_scene,
        classroom_id,
        scene_id,
        success=_("The class is now on “{result.title}”."),
    )
    return _back(classroom_id, "scenes")


@require_POST
def scene_delete(request: HttpRequest, classroom_id: int, scene_id: int) -> HttpResponse:
    _do(request, actions.delete_scene, classroom_id, scene_id, success=_("Deleted “{result}”."))
    return _back(classroom_id, "scenes")


# --- personas ------------------------------------------------------------------------------------


def _persona_fields(request: HttpRequest) -> dict:
    return {
        "name": request.POST.get("name", ""),
        "role": request.POST.get("role", Persona.Role.STUDENT),
        "prompt": request.POST.get("prompt", ""),
        "avatar": request.POST.get("avatar", ""),
        "colour": request.POST.get("colour", ""),
        "model": request.POST.get("model", ""),
        "enabled": request.POST.get("enabled") == "on",
    }


@require_http_methods(["GET", "POST"])
def persona_edit(request: HttpRequest, classroom_id: int, persona_id: int | None = None):
    classroom = access_classroom(request.user, classroom_id, ClassAction.TEACH)
    persona = access_persona(request.user, classroom.pk, persona_id) if persona_id else None
    if request.method == "POST":
        fields = _persona_fields(request)
        saved = _do(request, actions.save_persona, classroom.pk, persona_id, **fields)
        if saved is not None:
            messages.success(request, _("Saved %(name)s.") % {"name": saved.name})
            return _back(classroom.pk, "personas")
        form = fields
    elif persona is not None:
        form = {
            f: getattr(persona, f)
            for f in ("name", "role", "prompt", "avatar", "colour", "model", "enabled")
        }
    else:
        form = {
            "name": "",
            "role": "student",
            "prompt": "",
            "avatar": "🙂",
            "colour": "#2563eb",
            "model": "",
            "enabled": True,
        }
    return render(
        request,
        "classroom/persona_edit.html",
        {
            "classroom": classroom,
            "persona": persona,
            "form": form,
            "roles": Persona.Role.choices,
            "models": available_models(),
        },
    )


@require_POST
def persona_delete(request: HttpRequest, classroom_id: int, persona_id: int) -> HttpResponse:
    _do(request, actions.delete_persona, classroom_id, persona_id, success=_("Removed {result}."))
    return _back(classroom_id, "personas")


@require_GET
def cast_css(request: HttpRequest, classroom_id: int) -> HttpResponse:
    """Each persona's colour for its bubbles (a stylesheet: the CSP allows no inline style)."""
    classroom = access_classroom(request.user, classroom_id, ClassAction.STUDY)
    rules = [
        f'.class-chat .msg.labelled[aria-label="{p.name}"], '
        f'.cast [data-persona="{p.name}"] {{ color: {p.colour}; }}'
        for p in classroom.personas.all()
    ]
    response = HttpResponse("\n".join(rules) + "\n", content_type="text/css; charset=utf-8")
    response["Cache-Control"] = "private, no-cache"
    return response


# --- the class chat ------------------------------------------------------------------------------


@require_GET
def class_chat(request: HttpRequest, classroom_id: int) -> HttpResponse:
    link = actions.open_class_chat(request.user, classroom_id)
    classroom, chat = link.classroom, link.chat
    page = page_of_items(chat.pk)
    live = transitions.live_run(chat)
    return render(
        request,
        "classroom/chat.html",
        {
            "classroom": classroom,
            "chat": chat,
            **panels.side_context(classroom),
            "page": page,
            "last_seq": resume_seq(chat, page),
            "live_run": live,
            "stream_html": _stream_html(live),
            "can_write": can_access_chat(request.user, chat, ChatAction.WRITE),
            "is_teacher": teaches(request.user, classroom),
            "viewers": viewers_of(chat.pk),
        },
    )


def home_panel(request: HttpRequest) -> str:
    """ "Your classes" on the home page, with the join form (registered with chat)."""
    return render_to_string(
        "classroom/_home_panel.html",
        {"classes": classrooms_of(request.user)},
        request=request,
    )


# --- the teacher in charge -----------------------------------------------------------------------


@require_GET
def class_live(request: HttpRequest, classroom_id: int, student_id: int | None = None):
    """The wall (every student's tile, live), or one student's class chat in full."""
    classroom = access_classroom(request.user, classroom_id, ClassAction.TEACH)
    tiles = wall.tiles(classroom, student_id=student_id)
    if student_id is not None:
        if not tiles:
            raise Http404("No such student")
        actions.record_views(
            request.user, classroom, [t.chat_id for t in tiles if t.chat_id], TeacherView.How.PAGE
        )
    guardrails = wall.guardrails_for(classroom)
    return render(
        request,
        "classroom/live.html",
        {
            "classroom": classroom,
            "tiles": tiles,
            "focused": tiles[0] if student_id is not None else None,
            "scenes": Scene.objects.filter(classroom=classroom),
            "guardrails": guardrails,
            "categories": [c for c in FlagCategory.choices if c[0] != FlagCategory.LLM],
            "on_flag_choices": OnFlag.choices,
            "models": available_models(),
        },
    )


@require_POST
def class_guardrails(request: HttpRequest, classroom_id: int) -> HttpResponse:
    access_classroom(request.user, classroom_id, ClassAction.TEACH)
    _do(
        request,
        actions.save_guardrails,
        classroom_id,
        categories=request.POST.getlist("categories"),
        words=request.POST.get("words", ""),
        on_flag=request.POST.get("on_flag", OnFlag.NOTIFY),
        check_model=request.POST.get("check_model", ""),
        success=_("Guardrails saved."),
    )
    return redirect("class_live", classroom_id)


def _attachment(body, content_type: str, name: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["Cache-Control"] = "private, no-store"
    return response


@require_GET
def class_export(request: HttpRequest, classroom_id: int) -> HttpResponse:
    """The class's zip: a transcript per student, a CSV summary and the flags (audited)."""
    classroom = access_classroom(request.user, classroom_id, ClassAction.TEACH)
    links = list(
        ClassroomChat.objects.filter(classroom=classroom).select_related("student", "chat")
    )
    for link in links:
        link.classroom = classroom
    actions.record_views(
        request.user, classroom, [link.chat_id for link in links], TeacherView.How.EXPORT
    )
    body = exports.class_zip(classroom, links)
    return _attachment(body, "application/zip", exports.zip_name(classroom))


@require_GET
def class_student_transcript(request: HttpRequest, classroom_id: int, student_id: int):
    classroom = access_classroom(request.user, classroom_id, ClassAction.TEACH)
    link = (
        ClassroomChat.objects.filter(classroom=classroom, student_id=student_id)
        .select_related("student", "chat")
        .first()
    )
    if link is None:
        raise Http404("No such student")
    link.classroom = classroom
    actions.record_views(request.user, classroom, [link.chat_id], TeacherView.How.EXPORT)
    return _attachment(
        exports.transcript(link), "text/markdown; charset=utf-8", exports.transcript_name(link)
    )


def viewers_of(chat_id) -> list[dict[str, Any]]:
    """'Who viewed this chat': per teacher and way, how often and when last."""
    rows = (
        TeacherView.objects.filter(chat_id=chat_id)
        .values("viewer__username", "how")
        .annotate(times=Count("pk"), last=Max("at"))
        .order_by("-last")
    )
    return [dict(row) for row in rows]
