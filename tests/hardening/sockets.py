"""Small helpers for the hardening tests: a chat socket over the real ASGI stack."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from chatsite.asgi import application

WAIT = 10.0
ORIGIN = b"http://localhost"


def logged_in_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def cookie_of(client: Client) -> str:
    return client.cookies[settings.SESSION_COOKIE_NAME].value


class Socket:
    def __init__(self, comm: WebsocketCommunicator) -> None:
        self.comm = comm
        self.frames: list[str] = []

    async def send(self, **frame: Any) -> None:
        await self.comm.send_to(text_data=json.dumps(frame))

    async def send_raw(self, text: str) -> None:
        await self.comm.send_to(text_data=text)

    async def receive(self, timeout: float = WAIT) -> str:
        frame = await self.comm.receive_from(timeout=timeout)
        self.frames.append(frame)
        return frame

    async def until(self, needle: str, timeout: float = WAIT) -> str:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.receive(timeout)
                if needle in frame:
                    return frame

    async def drain(self, quiet: float = 0.3) -> None:
        while not await self.comm.receive_nothing(timeout=quiet):
            await self.receive()

    async def closed_with(self, timeout: float = WAIT) -> int:
        """The close code of a socket the server closes (frames before it are kept)."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.comm.receive_output(timeout)
                if message["type"] == "websocket.close":
                    return message.get("code", 1000)
                self.frames.append(message.get("text", ""))

    async def close(self) -> None:
        await self.comm.disconnect()


async def open_socket(
    cookie: str | None,
    path: str,
    *,
    origin: bytes | None = ORIGIN,
    host: bytes | None = None,
    resync: bool = True,
) -> tuple[Socket, bool, Any]:
    headers = []
    if origin is not None:
        headers.append((b"origin", origin))
    if host is not None:
        headers.append((b"host", host))
    if cookie is not None:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    comm = WebsocketCommunicator(application, path, headers=headers)
    ok, code = await comm.connect(timeout=WAIT)
    socket = Socket(comm)
    if ok and resync:
        await socket.send(action="resync", last_seq=0)
    return socket, ok, code


async def chat_socket(cookie: str, chat_id: Any) -> Socket:
    socket, ok, code = await open_socket(cookie, f"/ws/chat/{chat_id}/")
    assert ok, f"socket refused ({code})"
    await socket.drain()
    return socket


adb = database_sync_to_async
