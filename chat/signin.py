"""Sign-in with a throttle in front of the password check (``chat/throttle.py``).

The login page and the admin's both use these forms: an attempt is counted against the
username and the address before ``authenticate`` hashes anything, and a locked door
answers with how long to wait (429), never with the password's verdict.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.http import HttpResponse
from django.utils.translation import ngettext

from chat import throttle


def locked_message(locked: throttle.Locked) -> str:
    return ngettext(
        "Too many failed sign-in attempts. Try again in %(minutes)d minute.",
        "Too many failed sign-in attempts. Try again in %(minutes)d minutes.",
        locked.minutes,
    ) % {"minutes": locked.minutes}


class ThrottledLoginMixin:
    request: Any
    cleaned_data: dict[str, Any]
    locked: throttle.Locked | None = None

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        if username is None or not password:
            return super().clean()  # type: ignore[misc]  # nothing to hash
        address = throttle.request_address(self.request) if self.request else "unknown"
        try:
            throttle.begin_login(username, address)
        except throttle.Locked as exc:
            self.locked = exc
            raise forms.ValidationError(locked_message(exc), code="locked") from None
        cleaned = super().clean()  # type: ignore[misc]
        throttle.login_succeeded(username, address)
        return cleaned  # type: ignore[no-any-return]


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass


class ThrottledLoginView(LoginView):
    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def form_invalid(self, form: Any) -> HttpResponse:
        locked = getattr(form, "locked", None)
        if locked is None:
            return super().form_invalid(form)
        response = self.render_to_response(
            self.get_context_data(form=form, locked=locked_message(locked)), status=429
        )
        response["Retry-After"] = str(locked.retry_after)
        return response
