"""The admin's provider and agent forms: every field checked with a clear message, a key
never lost by a failed save nor saved empty by accident, tool policies as selects.

A key typed into a form that fails validation is kept server-side: the re-rendered page
carries it only as a signed token of its encryption (``providersetup.pending_key_token``),
never in clear, and the next submit uses it unless another key is typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from django import forms
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from chat import catalog
from chat.agent.builtin_tools import default_registry
from chat.agent.registry import ApprovalPolicy
from chat.agent.subagent import DELEGATE
from chat.models import KEY_AFTER_URL_CHANGE, Agent, Provider, ProviderKey
from chat.providersetup import pending_key_token, read_pending_key
from chat.relay import secrets

TOKEN_SUFFIX = "__pending"


# --- keys ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyInput:
    """What a key field submitted: the typed key, and the token of one typed before."""

    typed: str = ""
    token: str = ""


@dataclass(frozen=True)
class KeyState:
    """What a key field shows: whether a key is stored, the token of a pending one."""

    stored: bool = False
    token: str = ""


class KeptKeyWidget(forms.PasswordInput):
    """A password box that never shows a key, plus the hidden token of a pending one."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__({"autocomplete": "new-password", **(attrs or {})}, render_value=False)

    def value_from_datadict(self, data, files, name):
        return KeyInput(str(data.get(name) or ""), str(data.get(name + TOKEN_SUFFIX) or ""))

    def value_omitted_from_data(self, data, files, name):
        return name not in data and name + TOKEN_SUFFIX not in data

    def render(self, name, value, attrs=None, renderer=None):
        state = value if isinstance(value, KeyState) else KeyState()
        box = super().render(name, None, attrs, renderer)
        if state.token:
            note = _("A new key was entered and is kept (not shown). Type here only to replace it.")
        elif state.stored:
            note = _(
                "A key is stored (not shown). Leave empty to keep it; type here to replace it."
            )
        else:
            note = _("No key is stored.")
        return format_html(
            '{}<input type="hidden" name="{}" value="{}"><div class="help key-state">{}</div>',
            box,
            name + TOKEN_SUFFIX,
            state.token,
            note,
        )


class KeptKeyField(forms.Field):
    """Cleans to the encrypted new key ("" when none was given); ``stored`` and ``scope``
    are set by the form (is a key stored; whose token a pending key may come from)."""

    widget = KeptKeyWidget
    default_error_messages = {
        "invalid": _(
            "That key has spaces or characters an API key never has: paste it again, exactly."
        ),
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)
        self.scope = ""
        self.stored = False

    def _typed(self, value: Any) -> str:
        return value.typed.strip() if isinstance(value, KeyInput) else ""

    def to_python(self, value: Any) -> str:
        typed = self._typed(value)
        if typed:
            if not typed.isascii() or not typed.isprintable() or " " in typed:
                raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
            return secrets.encrypt(typed)
        if isinstance(value, KeyInput):
            return read_pending_key(value.token, self.scope)
        return ""

    def bound_data(self, data: Any, initial: Any) -> KeyState:
        # What a re-rendered form carries: a pending key as a token, never the key.
        try:
            pending = self.to_python(data)
        except forms.ValidationError:
            pending = ""
        token = pending_key_token(pending, self.scope) if pending else ""
        return KeyState(stored=self.stored, token=token)

    def prepare_value(self, value: Any) -> KeyState:
        return value if isinstance(value, KeyState) else KeyState(stored=self.stored)

    def has_changed(self, initial: Any, data: Any) -> bool:
        return bool(self._typed(data) or (isinstance(data, KeyInput) and data.token))


class ScopedKeyFormMixin:
    """Forms with a key field: the admin sets ``key_scope`` (who edits what)."""

    key_scope = ""
    key_fields: tuple[str, ...] = ()

    def _setup_keys(self, stored: bool) -> None:
        for name in self.key_fields:
            field = self.fields[name]  # type: ignore[attr-defined]
            field.scope = f"{self.key_scope}:{name}"
            field.stored = stored


# --- providers -------------------------------------------------------------------------------

URL_HELP = _(
    "The address of its OpenAI-compatible API, starting with http:// or https://, "
    "e.g. https://api.openai.com/v1 or http://127.0.0.1:11434/v1."
)


def clean_base_url(value: str) -> str:
    value = (value or "").strip()
    if not value:
        return ""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise forms.ValidationError(
            _(
                "Enter the API's address starting with http:// or https://, "
                "e.g. https://api.openai.com/v1."
            ),
            code="scheme",
        )
    if parts.username or parts.password:
        raise forms.ValidationError(
            _("Put the key in the API key field, not in the address."), code="credentials"
        )
    if parts.query or parts.fragment:
        raise forms.ValidationError(
            _("The address cannot have a query (?…) or a fragment (#…): give the API's base."),
            code="query",
        )
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        raise forms.ValidationError(
            _("The port in the address is not valid."), code="port"
        ) from None
    return value.rstrip("/")


class ProviderForm(ScopedKeyFormMixin, forms.ModelForm):
    # Text, not a URLField: that one quietly puts "http://" before an address without a scheme.
    base_url = forms.CharField(
        label=_("Base URL"),
        required=False,
        max_length=500,
        help_text=URL_HELP,
        widget=forms.TextInput(attrs={"size": 60, "inputmode": "url"}),
    )
    api_key = KeptKeyField(label=_("API key"))
    no_key = forms.BooleanField(
        required=False,
        label=_("No key"),
        help_text=_(
            "Tick for a provider that needs no key (a local server). Removes a stored key."
        ),
    )
    key_fields = ("api_key",)

    class Meta:
        model = Provider
        fields = ["name", "kind", "base_url", "enabled"]
        help_texts = {
            "name": _(
                "Letters, digits, hyphens and underscores only (a “slug”), e.g. openai or "
                "local-vllm. Admins see it; users see the models' aliases."
            ),
        }
        widgets = {
            "name": forms.TextInput(
                attrs={
                    "pattern": "[-a-zA-Z0-9_]+",
                    "title": _("Letters, digits, hyphens and underscores only"),
                }
            ),
        }
        error_messages = {
            "name": {
                "invalid": _(
                    "Use only letters, digits, hyphens and underscores (no spaces), e.g. openai-main."
                ),
                "unique": _("Another provider already has this name."),
            },
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored_key = self._stored_key()
        self._setup_keys(bool(stored_key))
        if self.instance.pk and not stored_key:
            self.fields["no_key"].initial = True

    def _stored_key(self) -> str:
        if not self.instance.pk:
            return ""
        key = Provider.objects.filter(pk=self.instance.pk).values_list("api_key", flat=True)
        return key.first() or ""

    def _stored_url(self) -> str:
        if not self.instance.pk:
            return ""
        url = Provider.objects.filter(pk=self.instance.pk).values_list("base_url", flat=True)
        return (url.first() or "").rstrip("/")

    def clean_base_url(self) -> str:
        return clean_base_url(self.cleaned_data.get("base_url", ""))

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        new_key = data.get("api_key") or ""
        no_key = bool(data.get("no_key"))
        stored = self._stored_key()
        self.final_key = stored
        if data.get("kind") == Provider.Kind.DEMO:
            if new_key:
                self.final_key = new_key
            return data
        if "base_url" in data and not data["base_url"]:
            self.add_error(
                "base_url",
                _(
                    "An OpenAI-compatible provider needs its base URL, e.g. https://api.openai.com/v1."
                ),
            )
        if new_key and no_key:
            self.add_error("no_key", _("Enter a key or tick “No key”, not both."))
            return data
        url_changed = bool(
            self.instance.pk and "base_url" in data and data["base_url"] != self._stored_url()
        )
        if url_changed and stored and not new_key and not no_key:
            # A stored key never follows the provider to a new address.
            self.add_error(
                "api_key",
                _(
                    "The base URL changed: enter the key again (a stored key is never sent to "
                    "a new address), or tick “No key”."
                ),
            )
        elif not new_key and not stored and not no_key:
            self.add_error(
                "api_key",
                _("Enter the provider's API key, or tick “No key” if it needs none."),
            )
        self.final_key = new_key or ("" if no_key else stored)
        return data

    def save(self, commit: bool = True) -> Provider:
        self.instance.api_key = getattr(self, "final_key", self._stored_key())
        return super().save(commit)


class ProviderKeyForm(ScopedKeyFormMixin, forms.ModelForm):
    """A key of the provider's pool: written encrypted, never rendered back."""

    secret = KeptKeyField(label=_("Key"))
    key_fields = ("secret",)

    class Meta:
        model = ProviderKey
        fields = ["label", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setup_keys(bool(self.instance.pk and self.instance.secret))

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if not data.get("secret") and not self.instance.pk and "secret" not in self.errors:
            self.add_error("secret", _("Enter the key."))
        return data

    def save(self, commit: bool = True) -> ProviderKey:
        new = self.cleaned_data.get("secret")
        if new:
            self.instance.secret = new
            self.instance.last_error = ""
        elif self.instance.pk:
            # Stopped by a change of the provider's URL in this same submit (the provider
            # is saved first): only entering the key again starts it again.
            stopped = ProviderKey.objects.filter(
                pk=self.instance.pk, enabled=False, last_error=KEY_AFTER_URL_CHANGE
            ).exists()
            if stopped:
                self.instance.enabled = False
                self.instance.last_error = KEY_AFTER_URL_CHANGE
        return super().save(commit)


# --- agents ----------------------------------------------------------------------------------

POLICY_PREFIX = "policy_"
POLICY_WORDS = {
    ApprovalPolicy.AUTO: _("runs without asking"),
    ApprovalPolicy.ASK: _("asks the user each time"),
    ApprovalPolicy.DENY: _("never runs"),
}


def known_tools() -> dict[str, ApprovalPolicy]:
    """Tool name -> its policy when the agent sets none (what a run would use)."""
    tools = {t.name: t.policy for t in default_registry()}
    tools[DELEGATE] = ApprovalPolicy.AUTO  # offered to the model without asking (executor)
    return tools


def policy_field_name(tool: str) -> str:
    return POLICY_PREFIX + tool


def _policy_field(tool: str, default: ApprovalPolicy) -> forms.ChoiceField:
    choices: list[tuple[str, Any]] = [
        ("", _("Default: %(policy)s") % {"policy": POLICY_WORDS[default]})
    ]
    choices += [(policy.value, words) for policy, words in POLICY_WORDS.items()]
    return forms.ChoiceField(
        label=tool,
        choices=choices,
        required=False,
        error_messages={
            "invalid_choice": _("Pick one of the listed policies for %(tool)s.") % {"tool": tool}
        },
    )


def normalise_policies(raw: Any) -> dict[str, str]:
    """Stored tool policies as a run reads them: known values only ("ASK " → "ask")."""
    if not isinstance(raw, dict):
        return {}
    valid = {p.value for p in ApprovalPolicy}
    out: dict[str, str] = {}
    for name, value in raw.items():
        policy = str(value).strip().lower() if isinstance(value, str) else ""
        if isinstance(name, str) and policy in valid:
            out[name] = policy
    return out


class AgentFormBase(forms.ModelForm):
    tools = forms.MultipleChoiceField(
        label=_("Tools"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("The tools this agent may use."),
    )
    default_model = forms.ChoiceField(
        label=_("Default model"),
        required=False,
        help_text=_("The model a new chat with this agent starts with (a whitelisted alias)."),
    )
    personas = forms.CharField(
        label=_("Personas"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=_(
            "One name per line. With names, a reply may hold up to three of them, each its "
            "own labelled message."
        ),
    )
    max_rounds = forms.IntegerField(
        label=_("Max rounds"),
        min_value=1,
        max_value=100,
        initial=12,
        help_text=_("Model calls a run may make (1 to 100)."),
        error_messages={
            "min_value": _("A run needs at least 1 round."),
            "max_value": _("At most 100 rounds."),
            "invalid": _("Enter a whole number of rounds."),
        },
    )

    class Meta:
        model = Agent
        fields = ["name", "slug", "system_prompt", "default_model", "max_rounds", "is_default"]
        help_texts = {
            "slug": _(
                "Letters, digits, hyphens and underscores only, e.g. tutor. Scripts name the "
                "agent by it."
            ),
        }
        error_messages = {
            "slug": {
                "invalid": _("Use only letters, digits, hyphens and underscores, e.g. tutor."),
                "unique": _("Another agent already has this slug."),
            },
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tools = known_tools()
        stored_tools = [t for t in (self.instance.tools or []) if isinstance(t, str)]
        # A tool the registry no longer has is listed, not silently dropped on save.
        unknown = [t for t in stored_tools if t not in tools]
        cast(forms.ChoiceField, self.fields["tools"]).choices = [(t, t) for t in tools] + [
            (t, _("%(tool)s (not a known tool)") % {"tool": t}) for t in unknown
        ]
        aliases = [c.alias for c in catalog.available_models()]
        current = self.instance.default_model
        models: list[tuple[str, Any]] = [("", _("The site's default"))]
        models += [(a, a) for a in aliases]
        if current and current not in aliases:
            models.append((current, _("%(alias)s (not available now)") % {"alias": current}))
        cast(forms.ChoiceField, self.fields["default_model"]).choices = models
        if self.instance.pk:
            self.initial["tools"] = stored_tools
            self.initial["personas"] = "\n".join(
                p for p in (self.instance.personas or []) if isinstance(p, str)
            )
            policies = normalise_policies(self.instance.tool_policies)
            for tool in tools:
                self.initial[policy_field_name(tool)] = policies.get(tool, "")
        else:
            self.initial.setdefault("tools", list(catalog.DEFAULT_TOOLS))

    def clean_default_model(self) -> str:
        return self.cleaned_data.get("default_model") or ""

    def clean_personas(self) -> list[str]:
        names: list[str] = []
        seen: set[str] = set()
        for line in (self.cleaned_data.get("personas") or "").splitlines():
            name = line.strip()
            if not name:
                continue
            if any(c in name for c in "<>/"):
                raise forms.ValidationError(
                    _("“%(name)s”: a name cannot contain <, > or /.") % {"name": name}
                )
            if len(name) > 40:
                raise forms.ValidationError(
                    _("“%(name)s”: a name has at most 40 characters.") % {"name": name}
                )
            if name.casefold() in seen:
                raise forms.ValidationError(_("“%(name)s” is listed twice.") % {"name": name})
            seen.add(name.casefold())
            names.append(name)
        return names

    def save(self, commit: bool = True) -> Agent:
        agent = self.instance
        agent.tools = list(self.cleaned_data.get("tools") or [])
        agent.personas = self.cleaned_data.get("personas") or []
        tools = known_tools()
        # Policies of tools this form does not show (a tool from elsewhere) are kept.
        policies = {
            k: v for k, v in normalise_policies(agent.tool_policies).items() if k not in tools
        }
        for tool in tools:
            value = self.cleaned_data.get(policy_field_name(tool)) or ""
            if value:
                policies[tool] = value
        agent.tool_policies = policies
        return super().save(commit)


def _agent_form() -> type[AgentFormBase]:
    fields = {policy_field_name(t): _policy_field(t, d) for t, d in known_tools().items()}
    return type("AgentForm", (AgentFormBase,), fields)


AgentForm = _agent_form()
