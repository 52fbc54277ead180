"""WebSocket routes and the worker channel on which runs are dispatched."""

from django.conf import settings

from chat.runner import RunWorkerConsumer

websocket_urlpatterns: list = []

channel_routes = {settings.LYCEUM_WORKER_CHANNEL: RunWorkerConsumer.as_asgi()}
