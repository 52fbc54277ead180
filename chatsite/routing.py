"""WebSocket routes and the worker channel on which runs are dispatched."""

from django.conf import settings
from django.urls import path, re_path

from chat.live.consumers import ChatConsumer, UnknownSocket
from chat.runhost.worker import RunWorkerConsumer
from classroom.consumers import WallConsumer

websocket_urlpatterns = [
    path("ws/chat/<uuid:chat_id>/", ChatConsumer.as_asgi()),
    path("ws/classes/<int:classroom_id>/live/", WallConsumer.as_asgi()),
    # Last: an unknown path or a malformed chat id is closed with 4404, not a traceback.
    re_path(r"", UnknownSocket.as_asgi()),
]

channel_routes = {settings.LYCEUM_WORKER_CHANNEL: RunWorkerConsumer.as_asgi()}
