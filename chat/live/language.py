"""The language of a socket's page: what LocaleMiddleware does for a request.

The picker's cookie first, then the browser's Accept-Language, then ``LANGUAGE_CODE``.
A consumer activates it once it connects, so what it renders for its page (notices, a
resync) is in the page's language.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import translation
from django.utils.translation.trans_real import parse_accept_lang_header


def scope_language(scope: dict[str, Any]) -> str:
    candidates = []
    cookie = (scope.get("cookies") or {}).get(settings.LANGUAGE_COOKIE_NAME)
    if cookie:
        candidates.append(cookie)
    headers = dict(scope.get("headers") or [])
    accept = headers.get(b"accept-language", b"").decode("latin-1")
    candidates += [code for code, _quality in parse_accept_lang_header(accept) if code != "*"]
    for code in candidates:
        try:
            return translation.get_supported_language_variant(code)
        except LookupError:
            continue
    return settings.LANGUAGE_CODE
