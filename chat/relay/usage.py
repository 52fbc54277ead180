"""Usage records beyond the relay's own requests (chat runs), and the Usage page's figures."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from chat import rows
from chat.llm.types import Usage
from chat.models import Run, UsageRecord
from chat.relay import limits

logger = logging.getLogger(__name__)


def record_run_usage(run: Run, usage: Usage, status: str) -> None:
    """A finished chat run counts against its owner's budget, like a relay request.

    Called inside ``finish_run``'s transaction, once per run (only the call that moved the
    run to its terminal state gets here, so a plain insert: the record is unique per run).
    The budget's counter is touched only when the owner has a budget; a counter created
    later is seeded from these records (``limits.used_in_period``).
    """
    owner_id: int | None
    if Run.chat.is_cached(run):  # type: ignore[attr-defined]
        owner_id = run.chat.owner_id
    else:
        owner_id = Run.objects.filter(pk=run.pk).values_list("chat__owner_id", flat=True).first()
    if owner_id is None:
        return
    # Written out (chat/rows.py: nothing listens to a usage record's save): every run's end
    # makes it on the process's one database thread.
    rows.create(
        UsageRecord,
        run_id=run.pk,
        user_id=owner_id,
        source=UsageRecord.Source.CHAT,
        model=run.model,
        stream=True,
        status="ok" if status == Run.Status.COMPLETED else str(status),
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        estimated=usage.estimated,
    )
    total = usage.input_tokens + usage.output_tokens
    policy = limits.user_policy(owner_id)
    if total and policy.monthly_tokens:
        try:
            limits.add_used([policy], total)
        except Exception as exc:  # noqa: BLE001 - see below
            # The counter may live in Redis: an outage must not roll back the run's end
            # (it did, and the run was left to the sweeper). The record above is the
            # truth; a counter lost with Redis is seeded from the records again.
            logger.warning("budget counter of user %s missed %s tokens: %s", owner_id, total, exc)


@dataclass(frozen=True)
class Bar:
    x: int
    y: int
    width: int
    height: int
    label: str
    value: int


CHART_WIDTH, CHART_HEIGHT = 600, 120


def summary(records: Any, days: int = 30) -> dict[str, Any]:
    """Tokens per day (with chart bars) and per model, over the last ``days``."""
    since = timezone.now() - timedelta(days=days)
    recent = records.filter(created_at__gte=since)
    per_day = {
        row["day"]: int((row["p"] or 0) + (row["c"] or 0))
        for row in recent.annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    }
    today = timezone.localdate()  # the days TruncDate gives: the site's time zone
    series = [(today - timedelta(days=i), 0) for i in range(days - 1, -1, -1)]
    series = [(day, per_day.get(day, 0)) for day, _ in series]
    peak = max((v for _, v in series), default=0) or 1
    slot = CHART_WIDTH // days
    bars = []
    for index, (day, value) in enumerate(series):
        height = round(value / peak * (CHART_HEIGHT - 20))
        bars.append(
            Bar(
                index * slot + 1,
                CHART_HEIGHT - height,
                max(1, slot - 2),
                height,
                day.isoformat(),
                value,
            )
        )
    per_model = list(
        recent.values("model")
        .annotate(
            requests=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
        )
        .order_by("-requests")
    )
    return {
        "bars": bars,
        "peak": peak if peak > 1 else max(v for _, v in series),
        "per_model": per_model,
        "chart_width": CHART_WIDTH,
        "chart_height": CHART_HEIGHT,
        "days": days,
    }
