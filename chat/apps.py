from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chat import catalog, requestdb
        from chat.live import sessions

        sessions.connect_signals()
        catalog.connect_signals()
        requestdb.connect_signals()
