"""Daphne's requests leave POSTed forms to the app (chatsite/postforms.py)."""

from __future__ import annotations

from unittest import mock


def test_daphne_requests_leave_post_forms_to_the_app():
    from daphne.http_protocol import WebRequest

    import chatsite.asgi  # noqa: F401 - installs chatsite.postforms

    request = WebRequest(mock.Mock(), queued=False)
    assert request._parsePOSTFormSubmission is False  # Twisted's form parse is skipped
