"""What a user may pick: agents and models, and the provider that serves each model.

Models come from admin-managed ``ProviderModel`` rows, from the environment
bootstrap (``LYCEUM_OPENAI_*``) and from the offline demo provider. Users only
ever name an alias; :func:`resolve_model` turns it into a provider and the real
model id, so an alias never reaches a provider unresolved.

Providers have a lifecycle: one provider (with its HTTP client and connection pool)
per provider configuration and event loop, kept while the configuration stays the
same, replaced (and the old one closed) when it changes, and all closed at shutdown
(:func:`close_providers`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.utils.translation import gettext

from chat.llm.demo import DemoProvider
from chat.llm.openai import OpenAIProvider
from chat.llm.types import Provider as LLMProvider
from chat.models import Agent, Provider, ProviderModel
from chat.relay import ttlcache
from chat.relay.secrets import decrypt

logger = logging.getLogger(__name__)

ENV_PROVIDER = "env"
DEMO_MODELS = {"demo": 32_000, "demo-fast": 32_000}
DEFAULT_CONTEXT_WINDOW = 32_000


class UnknownModel(LookupError):
    def __init__(self, alias: str) -> None:
        super().__init__(
            gettext("The model '%(alias)s' is not available. Pick one of the listed models.")
            % {"alias": alias}
        )
        self.alias = alias


@dataclass(frozen=True)
class ModelChoice:
    alias: str
    provider_name: str
    model_id: str
    context_window: int
    accepts_images: bool = False  # attached images go to it as input


def _openai(name: str, base_url: str, api_key: str) -> OpenAIProvider:
    return OpenAIProvider(
        name,
        base_url,
        api_key,
        connect_timeout=settings.LYCEUM_CONNECT_TIMEOUT,
        first_byte_timeout=settings.LYCEUM_FIRST_BYTE_TIMEOUT,
        idle_timeout=settings.LYCEUM_IDLE_TIMEOUT,
        max_retries=settings.LYCEUM_MAX_RETRIES,
        backoff_base=getattr(settings, "LYCEUM_RETRY_BACKOFF", 1.0),
        # Reading more often than the page is updated would only cost CPU.
        read_interval=settings.LYCEUM_STREAM_PUSH_INTERVAL,
    )


def checking_provider(row: Provider, timeout: float) -> OpenAIProvider:
    """A one-off provider for an admin's check of ``row`` (Test connection, Fetch models).

    Built like the providers of runs (same class, network layer and proxy rules), with
    ``timeout`` for every wait and no retries: the admin wants an answer, not patience.
    The caller closes it.
    """
    return OpenAIProvider(
        row.name,
        row.base_url,
        decrypt(row.api_key),
        connect_timeout=timeout,
        first_byte_timeout=timeout,
        idle_timeout=timeout,
        complete_timeout=timeout,
        max_retries=0,
    )


def _demo(model_id: str) -> DemoProvider:
    delay = 0.0 if model_id == "demo-fast" else settings.LYCEUM_DEMO_TOKEN_DELAY
    return DemoProvider("demo", token_delay=delay)


@lru_cache(maxsize=8)
def _env_models(base_url: str, api_key: str, listed: tuple[str, ...]) -> tuple[str, ...]:
    if listed:
        return listed
    # Empty list: offer what the provider says it has (asked once per process).
    try:
        return tuple(asyncio.run(_openai(ENV_PROVIDER, base_url, api_key).list_models()))
    except Exception as exc:  # noqa: BLE001 - a bad bootstrap must not take the site down
        logger.warning("could not list models of %s: %s", ENV_PROVIDER, exc)
        return ()


def _env_choices() -> list[ModelChoice]:
    base_url = settings.LYCEUM_OPENAI_BASE_URL
    if not base_url:
        return []
    models = _env_models(
        base_url, settings.LYCEUM_OPENAI_API_KEY, tuple(settings.LYCEUM_OPENAI_MODELS)
    )
    return [ModelChoice(m, ENV_PROVIDER, m, DEFAULT_CONTEXT_WINDOW) for m in models]


def available_models() -> list[ModelChoice]:
    """The whitelist, in display order: admin rows, then the environment bootstrap, then demo."""
    rows = ProviderModel.objects.filter(enabled=True, provider__enabled=True).select_related(
        "provider"
    )
    choices = [
        ModelChoice(r.alias, r.provider.name, r.model_id, r.context_window, r.accepts_images)
        for r in rows
    ]
    taken = {c.alias for c in choices}
    choices += [c for c in _env_choices() if c.alias not in taken]
    taken |= {c.alias for c in choices}
    if not Provider.objects.filter(kind=Provider.Kind.DEMO, enabled=False).exists():
        choices += [
            # The demo model takes images (it describes what it was sent).
            ModelChoice(alias, "demo", alias, window, True)
            for alias, window in DEMO_MODELS.items()
            if alias not in taken
        ]
    return choices


def default_model(preferred: str = "") -> str:
    aliases = [c.alias for c in available_models()]
    if preferred in aliases:
        return preferred
    if not aliases:
        raise UnknownModel(preferred or "(none configured)")
    return aliases[0]


@dataclass(frozen=True)
class ResolvedModel:
    choice: ModelChoice
    provider: LLMProvider


def resolve_model(alias: str) -> ResolvedModel:
    """The model a run uses and its provider.

    The whitelist and the provider's row are kept ``LYCEUM_RELAY_CACHE_SECONDS`` in
    memory (``chat.relay.ttlcache``, the relay's ``models`` entry): every run start read
    them (three statements) on the process's one database thread. A change in the admin
    drops them in this process at once (:func:`forget_providers`), elsewhere within
    that time.
    """
    for choice in ttlcache.cached("models", available_models):
        if choice.alias == alias:
            return ResolvedModel(choice, _provider_for(choice))
    raise UnknownModel(alias)


def _provider_for(choice: ModelChoice) -> LLMProvider:
    if choice.provider_name == "demo":
        return _demo(choice.model_id)
    if choice.provider_name == ENV_PROVIDER:
        config = (ENV_PROVIDER, settings.LYCEUM_OPENAI_BASE_URL, settings.LYCEUM_OPENAI_API_KEY)
    else:
        name = choice.provider_name
        stored = ttlcache.cached(("provider", name), lambda: _provider_config(name))
        if stored is None:
            return _demo(choice.model_id)
        config = stored
    return _kept_provider(config)


def _provider_config(name: str) -> tuple[str, str, str] | None:
    """A provider row's configuration (None: a demo provider)."""
    row = Provider.objects.get(name=name)
    if row.kind == Provider.Kind.DEMO:
        return None
    return (row.name, row.base_url, decrypt(row.api_key))


def forget_providers(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """Drop what this process keeps of the whitelist and the providers (a row changed)."""
    ttlcache.forget("models")
    ttlcache.forget_where(lambda key: isinstance(key, tuple) and key[:1] == ("provider",))


def connect_signals() -> None:
    from django.db.models.signals import post_delete, post_save

    for model in (Provider, ProviderModel):
        for signal in (post_save, post_delete):
            signal.connect(
                forget_providers, sender=model, dispatch_uid=f"lyceum-catalog-{model.__name__}"
            )


# --- provider lifecycle ------------------------------------------------------------------------

# provider name -> (its configuration, the provider). A provider opens its HTTP client in
# the event loop that first uses it (and a new one if used from another loop).
_providers: dict[str, tuple[tuple[Any, ...], OpenAIProvider]] = {}
_retired: list[OpenAIProvider] = []


def _kept_provider(config: tuple[str, str, str]) -> OpenAIProvider:
    """The provider for ``config``, kept for reuse; a changed configuration replaces it."""
    name = config[0]
    settings_key = (
        settings.LYCEUM_CONNECT_TIMEOUT,
        settings.LYCEUM_FIRST_BYTE_TIMEOUT,
        settings.LYCEUM_IDLE_TIMEOUT,
        settings.LYCEUM_MAX_RETRIES,
        getattr(settings, "LYCEUM_RETRY_BACKOFF", 1.0),
        settings.LYCEUM_STREAM_PUSH_INTERVAL,
    )
    full = (*config, *settings_key)
    key = name
    kept = _providers.get(key)
    if kept is not None and kept[0] == full:
        return kept[1]
    if kept is not None:
        _retired.append(kept[1])  # closed by close_providers (its runs may still use it)
    provider = _openai(*config)
    _providers[key] = (full, provider)
    return provider


async def close_providers() -> None:
    """Close every kept provider's connections (shutdown, tests)."""
    providers = [p for _c, p in _providers.values()] + _retired
    _providers.clear()
    _retired.clear()
    for provider in providers:
        try:
            await provider.aclose()
        except Exception:  # noqa: BLE001 - closing is best effort
            logger.debug("closing provider %s failed", provider, exc_info=True)


# --- agents ---------------------------------------------------------------------------------------

DEFAULT_SLUG = "assistant"
DEFAULT_PROMPT = (
    "You are Lyceum's assistant: helpful, precise and friendly. Answer in Markdown. "
    "Use your tools when they help: calculator for arithmetic, current_time for the date, "
    "the file tools to write, edit, read and list files in this chat's workspace, and "
    "delegate to hand a self-contained task to a sub-agent."
)
DEFAULT_TOOLS = [
    "calculator",
    "current_time",
    "write_file",
    "edit_file",
    "read_file",
    "list_files",
    "delegate",
]


def default_agent() -> Agent:
    """The default agent; made again if an admin deleted every agent."""
    agent = Agent.objects.filter(is_default=True).first() or Agent.objects.first()
    if agent is None:
        agent, _ = Agent.objects.get_or_create(
            slug=DEFAULT_SLUG,
            defaults={
                "name": "Assistant",
                "system_prompt": DEFAULT_PROMPT,
                "tools": DEFAULT_TOOLS,
                "is_default": True,
            },
        )
    return agent


PANEL_SLUG = "panel"
PANEL_PERSONAS = ["Ada", "Basil"]
PANEL_PROMPT = (
    "You are a panel of two tutors who answer together. Ada is precise and likes to "
    "check each step; Basil is curious and asks a question back. Answer as one or both."
)


def ensure_panel_agent() -> Agent:
    """An agent that speaks with two voices (Ada and Basil): multi-speaker replies to try."""
    agent, _ = Agent.objects.get_or_create(
        slug=PANEL_SLUG,
        defaults={
            "name": "Panel (Ada and Basil)",
            "system_prompt": PANEL_PROMPT,
            "tools": [],
            "personas": PANEL_PERSONAS,
        },
    )
    return agent
