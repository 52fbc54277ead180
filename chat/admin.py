from django import forms
from django.contrib import admin

from chat.models import (
    Agent,
    ApiKey,
    ChatEvent,
    ChatSession,
    Provider,
    ProviderKey,
    ProviderModel,
    RelayLimit,
    Run,
    UsageRecord,
)
from chat.relay import secrets


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

    # The log is append-only: events go away only with their whole chat.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ProviderModelInline(admin.TabularInline):
    model = ProviderModel
    extra = 1
    fields = [
        "alias",
        "model_id",
        "context_window",
        "max_output_tokens",
        "accepts_images",
        "enabled",
    ]


class ProviderKeyForm(forms.ModelForm):
    """A pool key: written encrypted, never rendered back (empty keeps the stored one)."""

    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the current key.",
    )

    class Meta:
        model = ProviderKey
        fields = ["label", "secret", "enabled"]

    def clean_secret(self):
        raw = self.cleaned_data.get("secret") or ""
        if raw:
            return secrets.encrypt(raw)
        if self.instance.pk:
            return ProviderKey.objects.get(pk=self.instance.pk).secret
        raise forms.ValidationError("Enter the key.")


class ProviderKeyInline(admin.TabularInline):
    model = ProviderKey
    form = ProviderKeyForm
    extra = 1
    fields = ["label", "secret", "enabled", "requests", "failures", "last_status", "cooldown_until"]
    readonly_fields = ["requests", "failures", "last_status", "cooldown_until"]


class ProviderForm(forms.ModelForm):
    class Meta:
        model = Provider
        fields = ["name", "kind", "base_url", "api_key", "enabled"]

    def clean(self):
        data = super().clean()
        if (
            self.instance.pk
            and "base_url" in self.changed_data
            and not data.get("api_key")
            and Provider.objects.filter(pk=self.instance.pk).exclude(api_key="").exists()
        ):
            # A key must never follow a URL change to a new host.
            self.add_error(
                "api_key", "Changing the base URL needs the key entered again (or a new one)."
            )
        return data


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    """Base URLs and keys are admin-only: nothing else in the app shows or edits them."""

    form = ProviderForm
    list_display = ["name", "kind", "base_url", "enabled"]
    inlines = [ProviderModelInline, ProviderKeyInline]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if "api_key" in form.base_fields:
            # Never render the stored key back into the page.
            form.base_fields["api_key"].widget = forms.PasswordInput(render_value=False)
            form.base_fields["api_key"].help_text = "Leave empty to keep the current key."
        return form

    def save_model(self, request, obj, form, change):
        if change and not form.cleaned_data.get("api_key"):
            obj.api_key = Provider.objects.get(pk=obj.pk).api_key
        elif obj.api_key and not secrets.is_encrypted(obj.api_key):
            obj.api_key = secrets.encrypt(obj.api_key)  # stored encrypted, never in clear
        super().save_model(request, obj, form, change)


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "default_model", "is_default"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["pk", "chat", "status", "model", "started_at", "input_tokens", "output_tokens"]
    list_filter = ["status", "model"]
    readonly_fields = [f.name for f in Run._meta.fields]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]


@admin.register(RelayLimit)
class RelayLimitAdmin(admin.ModelAdmin):
    list_display = ["__str__", "user", "api_key", "requests_per_minute", "burst", "monthly_tokens"]


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "user",
        "source",
        "model",
        "status",
        "prompt_tokens",
        "completion_tokens",
        "estimated",
        "latency_ms",
        "ttft_ms",
    ]
    list_filter = ["source", "status", "model", "estimated"]
    search_fields = ["user__username", "session_key", "agent_id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
