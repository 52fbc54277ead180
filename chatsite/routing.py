"""WebSocket routes (consumers arrive with the live chat)."""

websocket_urlpatterns: list = []
