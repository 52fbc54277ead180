"""Daphne's requests skip Twisted's parsing of POSTed forms (Daphne never reads it).

Twisted's ``http.Request`` parses the body of every POST with a Content-Type into
``request.args`` (the content type through the ``email`` package, the form itself with
``parse_qs`` or the multipart parser) before Daphne sees the request. Daphne hands the
raw body to the ASGI app and never reads ``args``, so that is work thrown away on every
POST: about 0.15 ms of CPU per relay request, and a second parse of every form Django
parses anyway. ``install()`` is called by ``chatsite/asgi.py``, like ``sendnow.py``.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = "_lyceum_no_post_forms"


def install() -> None:
    from daphne.http_protocol import WebRequest

    if getattr(WebRequest, _INSTALLED, False):
        return
    init = WebRequest.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False  # twisted.web.http.Request's switch

    WebRequest.__init__ = __init__  # type: ignore[method-assign]
    setattr(WebRequest, _INSTALLED, True)
