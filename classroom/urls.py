from django.urls import path

from classroom import views

urlpatterns = [
    path("", views.class_list, name="class_list"),
    path("new/", views.class_new, name="class_new"),
    path("join/", views.class_join, name="class_join"),
    path("join/<str:code>/", views.class_join, name="class_join_link"),
    path("<int:classroom_id>/", views.class_detail, name="class_detail"),
    path("<int:classroom_id>/chat/", views.class_chat, name="class_chat"),
    path("<int:classroom_id>/live/", views.class_live, name="class_live"),
    path(
        "<int:classroom_id>/live/<int:student_id>/",
        views.class_live,
        name="class_live_student",
    ),
    path("<int:classroom_id>/guardrails/", views.class_guardrails, name="class_guardrails"),
    path("<int:classroom_id>/export.zip", views.class_export, name="class_export"),
    path(
        "<int:classroom_id>/students/<int:student_id>/transcript.md",
        views.class_student_transcript,
        name="class_student_transcript",
    ),
    path("<int:classroom_id>/cast.css", views.cast_css, name="class_cast_css"),
    path("<int:classroom_id>/settings/", views.class_settings, name="class_settings"),
    path("<int:classroom_id>/code/", views.class_code, name="class_code"),
    path("<int:classroom_id>/archive/", views.class_archive, name="class_archive"),
    path(
        "<int:classroom_id>/co-teachers/add/",
        views.class_co_teacher_add,
        name="class_co_teacher_add",
    ),
    path(
        "<int:classroom_id>/co-teachers/<int:user_id>/remove/",
        views.class_co_teacher_remove,
        name="class_co_teacher_remove",
    ),
    path(
        "<int:classroom_id>/roster/<int:enrollment_id>/remove/",
        views.class_remove_student,
        name="class_remove_student",
    ),
    path("<int:classroom_id>/scenes/new/", views.scene_edit, name="scene_new"),
    path("<int:classroom_id>/scenes/preview/", views.scene_preview, name="scene_preview"),
    path("<int:classroom_id>/scenes/<int:scene_id>/", views.scene_edit, name="scene_edit"),
    path("<int:classroom_id>/scenes/<int:scene_id>/move/", views.scene_move, name="scene_move"),
    path(
        "<int:classroom_id>/scenes/<int:scene_id>/current/",
        views.scene_current,
        name="scene_current",
    ),
    path(
        "<int:classroom_id>/scenes/<int:scene_id>/delete/",
        views.scene_delete,
        name="scene_delete",
    ),
    path("<int:classroom_id>/personas/new/", views.persona_edit, name="persona_new"),
    path("<int:classroom_id>/personas/<int:persona_id>/", views.persona_edit, name="persona_edit"),
    path(
        "<int:classroom_id>/personas/<int:persona_id>/delete/",
        views.persona_delete,
        name="persona_delete",
    ),
]
