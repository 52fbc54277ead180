from django.urls import path

from classroom import api

urlpatterns = [
    path("<int:classroom_id>/chat", api.classroom_chat, name="api_classroom_chat"),
    path(
        "<int:classroom_id>/chat/stream",
        api.classroom_chat_stream,
        name="api_classroom_chat_stream",
    ),
    path("<int:classroom_id>/history", api.classroom_history, name="api_classroom_history"),
]
