"""ASGI entry point: HTTP through Django, WebSockets through Channels consumers."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Django must be set up before anything imports models (consumers, routing).
django_asgi_app = get_asgi_application()

from chatsite.backlog import install as install_backlog  # noqa: E402
from chatsite.postforms import install as install_postforms  # noqa: E402
from chatsite.sendnow import install as install_sendnow  # noqa: E402

install_backlog()
install_postforms()
install_sendnow()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ChannelNameRouter, ProtocolTypeRouter, URLRouter  # noqa: E402

from chat.relay import asgi as relay_asgi  # noqa: E402
from chatsite.origins import ExactOriginValidator  # noqa: E402
from chatsite.routing import channel_routes, websocket_urlpatterns  # noqa: E402


async def http_app(scope, receive, send):  # type: ignore[no-untyped-def]
    """The relay's two routes as raw ASGI (chat/relay/asgi.py), everything else Django."""
    if relay_asgi.handles(scope["path"]):
        return await relay_asgi.app(scope, receive, send)
    return await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        # The full scheme://host:port of the page, compared exactly (chatsite/origins.py).
        "websocket": ExactOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        "channel": ChannelNameRouter(channel_routes),
    }
)

# What the process set up to serve (modules, models, URL patterns, the app) lives as long as
# it does: frozen out of the collector's reach, a full collection walks only what was made
# since. Unfrozen, one took 35-67 ms of the event loop here (bench_relay.py, 100 streams).
gc.collect()
gc.freeze()
