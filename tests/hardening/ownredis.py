"""A Redis server of the test's own (port 6392), to stop and start without touching the
shared one."""

from __future__ import annotations

import subprocess
import time

import redis

PORT = 6392
URL = f"redis://127.0.0.1:{PORT}/0"


def start() -> None:
    subprocess.run(
        [
            "redis-server",
            "--port",
            str(PORT),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--dir",
            "/tmp",
        ],
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if up():
            return
        time.sleep(0.05)
    raise RuntimeError("redis on 6392 did not start")


def up() -> bool:
    client = redis.Redis(port=PORT, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def stop() -> None:
    """Shut down only our own server, by its port."""
    client = redis.Redis(port=PORT, socket_timeout=2)
    try:
        client.shutdown(nosave=True)
    except redis.RedisError:
        pass  # shutdown closes the connection under us
    finally:
        client.close()
    deadline = time.monotonic() + 10
    while up() and time.monotonic() < deadline:
        time.sleep(0.05)
