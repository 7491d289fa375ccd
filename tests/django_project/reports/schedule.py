"""Schedule the report every second in django-celery-beat's tables (as the admin would)."""

import json

from django_celery_beat.models import IntervalSchedule, PeriodicTask


def schedule_report(every: int = 1) -> PeriodicTask:
    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every, period=IntervalSchedule.SECONDS
    )
    task, _ = PeriodicTask.objects.update_or_create(
        name="nightly report",
        defaults={
            "task": "reports.tasks.nightly_report",
            "interval": interval,
            "args": json.dumps(["2026-11-24"]),
        },
    )
    return task
