from django.contrib import admin

from chat.models import ChatEvent, ChatSession


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "model", "updated_at"]
    list_filter = ["model"]
    search_fields = ["title", "owner__username"]
    readonly_fields = ["last_display_seq", "last_session_seq"]


@admin.register(ChatEvent)
class ChatEventAdmin(admin.ModelAdmin):
    list_display = ["chat", "channel", "seq", "kind", "created_at"]
    list_filter = ["channel", "kind"]

    def has_change_permission(self, request, obj=None):
        return False  # the log is append-only
