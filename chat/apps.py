from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chat import catalog
        from chat.live import sessions
        from chatsite import requestdb

        sessions.connect_signals()
        catalog.connect_signals()
        requestdb.connect_signals()
