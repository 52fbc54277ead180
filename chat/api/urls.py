from django.urls import path

from chat.api import views

urlpatterns = [
    path("chat", views.chat, name="api_chat"),
    path("chat/stream", views.chat_stream, name="api_chat_stream"),
    path("chat/<str:session_id>/cancel", views.cancel, name="api_cancel"),
    path("chat/<str:session_id>/runs/<str:run_id>", views.run_status, name="api_run"),
    path(
        "chat/<str:session_id>/approvals/<str:call_id>",
        views.approval,
        name="api_approval",
    ),
]
