from django.urls import path

from chat.api import views

urlpatterns = [
    path("chat", views.chat, name="api_chat"),
    path("chat/stream", views.chat_stream, name="api_chat_stream"),
    path("chat/<uuid:session_id>/cancel", views.cancel, name="api_cancel"),
    path(
        "chat/<uuid:session_id>/approvals/<str:call_id>",
        views.approval,
        name="api_approval",
    ),
]
