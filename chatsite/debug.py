"""What a debug page (or an error report) may show: never a credential.

Django's filter hides settings whose names look secret (``KEY``, ``PASS``, ...), but
not ``DATABASE_URL``/``REDIS_URL`` or a channel layer's ``address`` with a password in
it, and it shows every local variable of every frame, API keys included. This one
also hides URL-like settings, any value holding ``user:password@`` credentials, and
frame variables whose names or values look like keys.
"""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

SECRET_VALUE = re.compile(
    r"(lyk_|sk-)[A-Za-z0-9_-]{6,}|\bbearer\s+\S|://[^/\s:@]*:[^/\s@]+@", re.IGNORECASE
)


def _scrub(value: Any, substitute: str) -> Any:
    if isinstance(value, str) and SECRET_VALUE.search(value):
        return substitute
    if isinstance(value, dict):
        return {k: _scrub(v, substitute) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v, substitute) for v in value)
    return value


class SafeReporterFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DSN|ADDRESS|CREDENTIAL",
        flags=re.IGNORECASE,
    )

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        return _scrub(super().cleanse_setting(key, value), self.cleansed_substitute)

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        variables = super().get_traceback_frame_variables(request, tb_frame)
        return [
            (
                name,
                self.cleansed_substitute
                if self.hidden_settings.search(str(name))
                else _scrub(value, self.cleansed_substitute),
            )
            for name, value in variables
        ]
