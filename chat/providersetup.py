"""Setting up a provider: the admin's Test connection, Fetch models and the whitelist,
and the pending key a provider form keeps across a failed save.

Checks go through ``catalog.checking_provider``: the same provider class and network
layer as runs, one short wait, no retries. Every answer is a sentence for the admin;
none carries the key (the provider scrubs it from what it reports, and nothing here
logs it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from chat import catalog
from chat.core.messages import user
from chat.llm.openai import OpenAIProvider
from chat.llm.types import ChatRequest, ErrorCategory, ProviderError
from chat.models import Provider, ProviderModel
from chat.relay import secrets

T = TypeVar("T")

MAX_ALIAS = ProviderModel._meta.get_field("alias").max_length or 100
MAX_MODEL_ID = ProviderModel._meta.get_field("model_id").max_length or 200


class SetupError(Exception):
    """A check that could not be done or failed; ``message`` says why, for the admin."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class ConnectionCheck:
    ok: bool
    message: str


def _timeout() -> float:
    return float(settings.LYCEUM_PROVIDER_CHECK_TIMEOUT)


def _seconds(value: float) -> str:
    return f"{value:g}"


def _run(provider: Provider, call: Callable[[OpenAIProvider], Awaitable[T]]) -> T:
    """``call`` with a one-off checking provider in its own event loop (the admin is sync)."""
    try:
        llm = catalog.checking_provider(provider, _timeout())
    except secrets.UndecryptableKey:
        raise SetupError(
            _("The stored key cannot be decrypted with the configured secret: enter it again.")
        ) from None

    async def main() -> T:
        try:
            return await call(llm)
        finally:
            await llm.aclose()

    return asyncio.run(main())


def _explain(error: ProviderError, provider: Provider) -> str:
    """A provider's failure in plain words."""
    url = provider.base_url
    seconds = _seconds(_timeout())
    if error.status in (401, 403):
        if not provider.api_key:
            return _(
                "The provider refused the request without a key (%(status)s): enter its API key."
            ) % {"status": error.status}
        return _("The provider refused the key (%(status)s).") % {"status": error.status}
    if error.category == ErrorCategory.UNREACHABLE:
        if error.detail == "connection timed out":
            return _("Could not reach %(url)s: timed out after %(seconds)s s.") % {
                "url": url,
                "seconds": seconds,
            }
        reason = _network_reason_text(error.detail)
        return _("Could not reach %(url)s: %(reason)s.") % {"url": url, "reason": reason}
    if error.category == ErrorCategory.TIMED_OUT:
        return _("%(url)s did not answer: timed out after %(seconds)s s.") % {
            "url": url,
            "seconds": seconds,
        }
    return _("The provider answered with an error: %(message)s") % {"message": error.message}


def _network_reason_text(detail: str) -> str:
    reasons = {
        "connection refused": _("connection refused"),
        "connection reset": _("connection reset"),
        "no route to the host": _("no route to the host"),
        "the network is unreachable": _("the network is unreachable"),
        "the host name could not be resolved": _("the host name could not be resolved"),
        "the TLS handshake failed": _("the TLS handshake failed"),
    }
    return reasons.get(detail, _("the connection failed"))


def _not_checkable(provider: Provider) -> str | None:
    if provider.kind == Provider.Kind.DEMO:
        return _("This is the offline demo model: there is nothing to connect to.")
    if not provider.base_url:
        return _("This provider has no base URL yet: enter one and save.")
    return None


def check_connection(provider: Provider) -> ConnectionCheck:
    """Test connection: list the provider's models, or ask a whitelisted model for one token
    when the provider has no model list. Never raises for a provider's failure."""
    refusal = _not_checkable(provider)
    if refusal:
        return ConnectionCheck(False, refusal)
    fallback = (
        ProviderModel.objects.filter(provider=provider)
        .order_by("-enabled", "alias")
        .values_list("model_id", flat=True)
        .first()
    )

    async def probe(llm: OpenAIProvider) -> ConnectionCheck:
        try:
            models = await llm.list_models()
        except ProviderError as error:
            if error.status not in (404, 405) or not fallback:
                raise
        else:
            count = len(models)
            return ConnectionCheck(
                True,
                ngettext(
                    "Connected: %(count)s model available.",
                    "Connected: %(count)s models available.",
                    count,
                )
                % {"count": count},
            )
        request = ChatRequest(
            model=fallback,
            messages=[user("ping")],
            max_tokens=1,
            thinking=False,
        )
        await llm.complete(request)
        return ConnectionCheck(
            True,
            _("Connected: %(model)s answered (the provider lists no models).")
            % {"model": fallback},
        )

    try:
        return _run(provider, probe)
    except SetupError as error:
        return ConnectionCheck(False, error.message)
    except ProviderError as error:
        return ConnectionCheck(False, _explain(error, provider))


def fetch_models(provider: Provider) -> list[str]:
    """The provider's own model list (sorted ids); raises :class:`SetupError` with why not."""
    refusal = _not_checkable(provider)
    if refusal:
        raise SetupError(refusal)

    async def listing(llm: OpenAIProvider) -> list[str]:
        return await llm.list_models()

    try:
        models = _run(provider, listing)
    except ProviderError as error:
        if error.status in (404, 405):
            raise SetupError(
                _("The provider has no model list (%(status)s): add its models by hand below.")
                % {"status": error.status}
            ) from None
        raise SetupError(_explain(error, provider)) from None
    return [m for m in models if 0 < len(m) <= MAX_MODEL_ID]


# --- the whitelist ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WhitelistChange:
    added: list[str]  # aliases made
    removed: list[str]  # aliases removed
    skipped: list[str]  # model ids with no free alias


def whitelisted_ids(provider: Provider) -> dict[str, str]:
    """model id -> alias of the provider's whitelist entries."""
    return dict(ProviderModel.objects.filter(provider=provider).values_list("model_id", "alias"))


def _free_alias(provider: Provider, model_id: str) -> str | None:
    for candidate in (model_id, f"{provider.name}/{model_id}"):
        if (
            len(candidate) <= MAX_ALIAS
            and not ProviderModel.objects.filter(alias=candidate).exists()
        ):
            return candidate
    return None


def apply_whitelist(
    provider: Provider, offered: Iterable[str], ticked: Iterable[str]
) -> WhitelistChange:
    """Whitelist the ticked models among ``offered`` and remove the offered ones left unticked.

    Entries of models that were not offered are left alone. A new entry is named after
    the model id (or ``<provider>/<model id>`` when another provider has that alias).
    """
    offered_ids = {m for m in offered if 0 < len(m) <= MAX_MODEL_ID}
    wanted = {m for m in ticked if m in offered_ids}
    added: list[str] = []
    removed: list[str] = []
    skipped: list[str] = []
    with transaction.atomic():
        current = {
            row.model_id: row
            for row in ProviderModel.objects.select_for_update().filter(provider=provider)
        }
        for model_id in sorted(offered_ids - wanted):
            row = current.get(model_id)
            if row is not None:
                removed.append(row.alias)
                row.delete()
        for model_id in sorted(wanted - current.keys()):
            alias = _free_alias(provider, model_id)
            if alias is None:
                skipped.append(model_id)
                continue
            ProviderModel.objects.create(provider=provider, alias=alias, model_id=model_id)
            added.append(alias)
    return WhitelistChange(added, removed, skipped)


# --- a key typed into a form that did not save ----------------------------------------------------

KEY_TOKEN_SALT = "chat.providersetup.pending-key"
KEY_TOKEN_MAX_AGE = 3600  # seconds: a form left open longer asks for the key again


def pending_key_token(encrypted: str, scope: str) -> str:
    """A signed token of an encrypted key, for the hidden field of a re-rendered form.

    The page never holds the key in clear: only its encryption under the server's secret,
    signed and bound to ``scope`` (the admin and the object) so it is good for nothing else.
    """
    return signing.dumps({"k": encrypted, "s": scope}, salt=KEY_TOKEN_SALT)


def read_pending_key(token: str, scope: str) -> str:
    """The encrypted key in ``token`` if it is genuine, fresh and of ``scope``; else ""."""
    if not token:
        return ""
    try:
        data = signing.loads(token, salt=KEY_TOKEN_SALT, max_age=KEY_TOKEN_MAX_AGE)
    except signing.BadSignature:
        return ""
    if not isinstance(data, dict) or data.get("s") != scope:
        return ""
    key = data.get("k")
    return key if isinstance(key, str) and secrets.is_encrypted(key) else ""
