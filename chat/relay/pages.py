"""The Usage page: a person's requests, tokens per day and per model, and their limits.

Staff see everyone's (and may pick one user with ``?user=<username>``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from chat.models import UsageRecord
from chat.relay import limits, usage


def access_usage(request: HttpRequest) -> tuple[Any, Any]:
    """The records the requester may see, and whose they are (None: everyone's)."""
    records = UsageRecord.objects.select_related("user")
    if not request.user.is_staff:
        return records.filter(user_id=request.user.pk or 0), request.user
    username = request.GET.get("user", "")
    if username:
        who = get_user_model().objects.filter(username=username).first()
        return records.filter(user=who), who
    return records, None


@require_GET
def usage_page(request: HttpRequest) -> HttpResponse:
    records, who = access_usage(request)
    subject = who or request.user
    policy = limits.policies_for(subject)[0]
    used = limits.used_in_period(policy.scope, limits.period_of())
    context = {
        **usage.summary(records),
        "recent": records.order_by("-created_at")[:50],
        "who": who,
        "everyone": who is None,
        "policy": policy,
        "used_this_month": used,
        "budget_left": max(0, policy.monthly_tokens - used) if policy.monthly_tokens else None,
    }
    return render(request, "relay/usage.html", context)
