from django.urls import path, re_path

from chat.api import views

urlpatterns = [
    path("models", views.models, name="api_models"),
    path("chat", views.chat, name="api_chat"),
    path("chat/stream", views.chat_stream, name="api_chat_stream"),
    path("chat/<str:session_id>/cancel", views.cancel, name="api_cancel"),
    path("chat/<str:session_id>/runs/<str:run_id>", views.run_status, name="api_run"),
    path(
        "chat/<str:session_id>/runs/<str:run_id>/stream",
        views.run_stream,
        name="api_run_stream",
    ),
    path(
        "chat/<str:session_id>/approvals/<str:call_id>",
        views.approval,
        name="api_approval",
    ),
    path("chat/<str:session_id>/artifacts", views.artifacts_list, name="api_artifacts"),
    path(
        "chat/<str:session_id>/attachments",
        views.attachment_upload,
        name="api_attachment_upload",
    ),
    path("artifacts/<str:artifact_id>", views.artifact_detail, name="api_artifact"),
    path(
        "artifacts/<str:artifact_id>/versions/<int:number>/download",
        views.artifact_download,
        name="api_artifact_download",
    ),
    # Last: anything else under /api/v1/ answers JSON.
    re_path(r"^", views.not_found),
]
