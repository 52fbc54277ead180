"""The Usage page: one's own records, limits and a server-rendered chart; staff see all."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import RelayLimit, UsageRecord

pytestmark = pytest.mark.django_db


def _record(user, model: str, prompt: int, completion: int, **extra) -> UsageRecord:
    return UsageRecord.objects.create(
        user=user,
        model=model,
        status="ok",
        prompt_tokens=prompt,
        completion_tokens=completion,
        **extra,
    )


def test_a_user_sees_their_usage_and_limits(alice_client, alice, bob):
    RelayLimit.objects.create(user=alice, monthly_tokens=1000, requests_per_minute=30, burst=5)
    _record(alice, "gpt-relay", 100, 50, session_key="nightly")
    _record(alice, "other-model", 10, 5, estimated=True)
    _record(bob, "bobs-model", 1, 1)
    page = alice_client.get("/usage/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "gpt-relay" in html and "other-model" in html and "bobs-model" not in html
    assert "165 of 1000 used, 835 left" in html
    assert "30 per minute, bursts of 5" in html
    body = html.split("</header>")[1]
    # The page's texts for the scripts are a JSON data block, never run; no other script.
    body = re.sub(r'<script id="lyceum-texts" type="application/json">.*?</script>', "", body)
    assert "<svg" in html and "<rect" in html and "<script" not in body
    assert "(estimated)" in html and "nightly" in html
    assert 'href="/usage/"' in html  # linked in the top bar


def test_the_chart_spans_the_last_30_days_up_to_today(alice_client, alice):
    _record(alice, "gpt-relay", 100, 50)
    html = alice_client.get("/usage/").content.decode()
    today = timezone.localdate()
    first = today - timedelta(days=29)
    assert re.search(rf"<span>{first.isoformat()}</span><span>{today.isoformat()}</span>", html)
    bars = re.findall(r'<rect x="(\d+)" y="(\d+)" width="(\d+)" height="(\d+)"', html)
    assert len(bars) == 30
    assert int(bars[-1][3]) > 0 and all(int(bar[3]) == 0 for bar in bars[:-1])  # today's only
    # The bars fill the chart's width on any screen, not a box of fixed proportions.
    assert 'preserveAspectRatio="none"' in html


def test_staff_see_everyone(client, make_user, alice, bob):
    client.force_login(make_user("staffer", staff=True))
    _record(alice, "alice-model", 1, 1)
    _record(bob, "bob-model", 1, 1)
    html = client.get("/usage/").content.decode()
    assert "alice-model" in html and "bob-model" in html and "(everyone)" in html
    html = client.get("/usage/?user=bob").content.decode()
    assert "bob-model" in html and "alice-model" not in html


def test_the_page_needs_a_login(client):
    assert client.get("/usage/").status_code == 302
