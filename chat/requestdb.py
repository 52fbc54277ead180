"""An HTTP request's own database connection is closed when the request ends.

Under ASGI, Django runs each HTTP request's synchronous code in a thread of its own
(``ThreadSensitiveContext``), and a thread has its own connection. With persistent
connections (``CONN_MAX_AGE``, kept for the process's one database thread that sockets and
runs share) such a connection outlived its request and its thread, open until garbage
collected: under the soak (50 clients, a third of them over the API) PostgreSQL ran out
of connections ("too many clients") and requests failed. Django's advice is to turn
persistent connections off under ASGI; here they stay on for the shared thread, and a
request's own connection is closed at its end, as it would be with ``CONN_MAX_AGE=0``.
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_finished
from django.db import connections


def close_request_connections(sender: Any, **kwargs: Any) -> None:
    # Only an ASGI request's: the test client sends this signal on the test's own thread.
    if isinstance(sender, type) and issubclass(sender, ASGIHandler):
        connections.close_all()


def connect_signals() -> None:
    request_finished.connect(close_request_connections, dispatch_uid="lyceum-request-db")
