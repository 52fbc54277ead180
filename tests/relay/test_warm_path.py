"""The relay's warm path: caches kept fresh by the keeper, background work out of the way."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from chat.apikeys import revoke_api_key
from chat.models import ApiKey
from chat.relay import quiet

MESSAGES = [{"role": "user", "content": "hello"}]
CACHE_SECONDS = 0.5


@pytest.fixture
def short_cache(relay_settings):
    """Set before the live server forks (so before ``relay``)."""
    relay_settings.LYCEUM_RELAY_CACHE_SECONDS = CACHE_SECONDS
    return relay_settings


def test_a_key_in_steady_use_is_still_refused_within_the_cache_time_once_revoked(
    short_cache, relay
):
    client = relay.client()
    # Steady use over several cache times: the keeper reloads the entries ahead of expiry.
    until = time.monotonic() + 4 * CACHE_SECONDS
    answered = 0
    while time.monotonic() < until:
        reply = client.chat.completions.create(model="gpt-relay", messages=MESSAGES)
        assert reply.choices[0].message.content == "Hello from the fake model."
        answered += 1
        # Paced: as fast as it can go, a fast box met the fixture's rate limit (1,000
        # requests of burst) within these two seconds and the relay rightly said 429.
        time.sleep(0.01)
    assert answered >= 4

    key = ApiKey.objects.get(user=relay.user, revoked_at__isnull=True)
    assert revoke_api_key(relay.user, key.pk)
    revoked = time.monotonic()
    refused_after = None
    while time.monotonic() < revoked + CACHE_SECONDS + 2.0:
        try:
            client.chat.completions.create(model="gpt-relay", messages=MESSAGES)
        except openai.AuthenticationError:
            refused_after = time.monotonic() - revoked
            break
        time.sleep(0.01)
    assert refused_after is not None
    # The cache time, plus a reload already under way when the key was revoked.
    assert refused_after < CACHE_SECONDS + 0.5
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="gpt-relay", messages=MESSAGES)


async def test_background_work_waits_for_no_request_starting_but_never_long():
    await asyncio.wait_for(quiet.moment(), 0.05)  # nothing starting: at once

    starting = quiet.Starting()
    waiting = asyncio.ensure_future(quiet.moment())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    starting.done()
    starting.done()  # a request's end is counted once
    await asyncio.wait_for(waiting, 0.05)

    stuck = quiet.Starting()  # never gets its first byte out
    begun = time.monotonic()
    await quiet.moment()
    assert time.monotonic() - begun < quiet.QUIET_WAIT + 0.2
    stuck.done()
    await asyncio.wait_for(quiet.moment(), 0.05)
