"""Daphne's accepted connections have TCP_NODELAY on (Twisted's HTTPChannel sets it; with
Nagle on, a small write behind an unacknowledged one waits for the delayed ACK: 40 ms)."""

from __future__ import annotations

import socket
from unittest import mock


def test_an_accepted_connection_has_nagle_off():
    from daphne.http_protocol import HTTPFactory
    from twisted.internet import reactor, tcp

    import chatsite.asgi  # noqa: F401 - the app's own installs (sendnow) on the same path

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, addr = listener.accept()
    try:
        assert not conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        protocol = HTTPFactory(mock.Mock()).buildProtocol(addr)
        transport = tcp.Server(conn, protocol, addr, mock.Mock(), 1, reactor)
        protocol.makeConnection(transport)
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        transport.stopReading()
        transport.stopWriting()
    finally:
        client.close()
        conn.close()
        listener.close()


def test_daphne_requests_leave_post_forms_to_the_app():
    from daphne.http_protocol import WebRequest

    import chatsite.asgi  # noqa: F401 - installs chatsite.postforms

    request = WebRequest(mock.Mock(), queued=False)
    assert request._parsePOSTFormSubmission is False  # Twisted's form parse is skipped
