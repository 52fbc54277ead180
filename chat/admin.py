from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _

from chat import providersetup
from chat.admin_forms import (
    AgentForm,
    ProviderForm,
    ProviderKeyForm,
    known_tools,
    policy_field_name,
)
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


class ProviderKeyInline(admin.TabularInline):
    model = ProviderKey
    form = ProviderKeyForm
    extra = 1
    fields = ["label", "secret", "enabled", "requests", "failures", "last_status", "cooldown_until"]
    readonly_fields = ["requests", "failures", "last_status", "cooldown_until"]

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form = _scoped(formset.form, request, obj, "pool")
        return formset


def _scoped(form_class, request, obj, part: str):
    """The form class with its key tokens bound to this admin and this object."""
    scope = f"{request.user.pk}:{obj.pk if obj is not None else 'new'}:{part}"
    return type(form_class.__name__, (form_class,), {"key_scope": scope})


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    """Base URLs and keys are admin-only: nothing else in the app shows or edits them."""

    form = ProviderForm
    list_display = ["name", "kind", "base_url", "enabled"]
    fields = ["name", "kind", "base_url", "api_key", "no_key", "enabled"]
    inlines = [ProviderModelInline, ProviderKeyInline]
    change_form_template = "admin/chat/provider/change_form.html"

    def get_form(self, request, obj=None, **kwargs):
        return _scoped(super().get_form(request, obj, **kwargs), request, obj, "provider")

    def get_urls(self):
        own = [
            path(
                "<path:object_id>/test-connection/",
                self.admin_site.admin_view(self.test_connection_view),
                name="chat_provider_test_connection",
            ),
            path(
                "<path:object_id>/fetch-models/",
                self.admin_site.admin_view(self.fetch_models_view),
                name="chat_provider_fetch_models",
            ),
        ]
        return own + super().get_urls()

    def _changeable(self, request, object_id) -> Provider:
        """The provider, if this admin may change it (404 / 403 otherwise)."""
        provider = self.get_object(request, unquote(object_id))
        if provider is None:
            raise Http404
        if not self.has_change_permission(request, provider):
            raise PermissionDenied
        return provider

    def _change_url(self, provider: Provider) -> str:
        return reverse("admin:chat_provider_change", args=[provider.pk])

    def test_connection_view(self, request, object_id):
        provider = self._changeable(request, object_id)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        check = providersetup.check_connection(provider)
        level = messages.SUCCESS if check.ok else messages.ERROR
        self.message_user(request, check.message, level)
        return HttpResponseRedirect(self._change_url(provider))

    def fetch_models_view(self, request, object_id):
        provider = self._changeable(request, object_id)
        if request.method == "POST":
            offered = request.POST.getlist("offered")
            ticked = request.POST.getlist("model")
            change = providersetup.apply_whitelist(provider, offered, ticked)
            self.message_user(request, _whitelist_message(change), messages.SUCCESS)
            if change.skipped:
                self.message_user(
                    request,
                    _("No free alias for %(models)s: add them by hand with an alias of your own.")
                    % {"models": ", ".join(change.skipped)},
                    messages.WARNING,
                )
            return HttpResponseRedirect(self._change_url(provider))
        whitelisted = providersetup.whitelisted_ids(provider)
        error = ""
        try:
            listed = providersetup.fetch_models(provider)
        except providersetup.SetupError as failure:
            listed, error = [], failure.message
        rows = [{"id": m, "alias": whitelisted.get(m, ""), "listed": True} for m in listed]
        rows += [
            {"id": m, "alias": alias, "listed": False}
            for m, alias in sorted(whitelisted.items())
            if m not in set(listed)
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Models of %(provider)s") % {"provider": provider.name},
            "opts": self.model._meta,
            "original": provider,
            "rows": rows,
            "error": error,
            "change_url": self._change_url(provider),
        }
        return TemplateResponse(request, "admin/chat/provider/fetch_models.html", context)


def _whitelist_message(change: providersetup.WhitelistChange) -> str:
    if not change.added and not change.removed:
        return _("The whitelist is unchanged.")
    parts = []
    if change.added:
        parts.append(_("Whitelisted: %(aliases)s.") % {"aliases": ", ".join(change.added)})
    if change.removed:
        parts.append(_("Removed: %(aliases)s.") % {"aliases": ", ".join(change.removed)})
    return " ".join(str(p) for p in parts)


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentForm
    list_display = ["name", "slug", "default_model", "is_default"]
    prepopulated_fields = {"slug": ["name"]}

    def get_fieldsets(self, request, obj=None):
        policies = [policy_field_name(t) for t in known_tools()]
        return [
            (
                None,
                {
                    "fields": [
                        "name",
                        "slug",
                        "system_prompt",
                        "default_model",
                        "personas",
                        "max_rounds",
                        "is_default",
                    ]
                },
            ),
            (_("Tools"), {"fields": ["tools"]}),
            (
                _("Approval per tool"),
                {
                    "fields": policies,
                    "description": _(
                        "Whether each tool runs on its own, asks the user first, or never runs."
                    ),
                },
            ),
        ]

    def save_model(self, request, obj, form, change):
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if obj.is_default:
                # One default agent: the one just marked.
                Agent.objects.filter(is_default=True).exclude(pk=obj.pk).update(is_default=False)


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
