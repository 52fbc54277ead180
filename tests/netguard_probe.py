"""Run only by tests/test_network_guard.py, in a pytest subprocess (the name keeps it out
of the normal collection): checks the conftest from a fresh start."""

import os
import socket

from django.conf import settings

from tests import netguard


def test_provider_environment_is_ignored():
    assert os.environ.get("LYCEUM_PROBE_MARKER") == "set"  # the parent's environment arrived
    assert settings.LYCEUM_OPENAI_BASE_URL == ""
    assert settings.LYCEUM_OPENAI_API_KEY == ""
    assert settings.LYCEUM_OPENAI_MODELS == []
    for name in ("LYCEUM_OPENAI_BASE_URL", "LYCEUM_OPENAI_API_KEY", "OPENAI_API_KEY"):
        assert name not in os.environ


def test_a_swallowed_attempt_still_fails():
    try:
        with socket.socket() as sock:
            sock.connect(("10.255.255.1", 80))
    except netguard.NetworkBlocked:
        pass  # code under test that catches everything must not hide the attempt
