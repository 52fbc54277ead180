"""ASGI entry point: HTTP through Django, WebSockets through Channels consumers."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Django must be set up before anything imports models (consumers, routing).
django_asgi_app = get_asgi_application()

from chatsite.nodelay import install as install_nodelay  # noqa: E402

install_nodelay()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ChannelNameRouter, ProtocolTypeRouter, URLRouter  # noqa: E402

from chatsite.origins import ExactOriginValidator  # noqa: E402
from chatsite.routing import channel_routes, websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # The full scheme://host:port of the page, compared exactly (chatsite/origins.py).
        "websocket": ExactOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        "channel": ChannelNameRouter(channel_routes),
    }
)
