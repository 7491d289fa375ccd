"""The report app's tasks: a periodic report that runs longer than its period, locked so that
two runs never overlap; each run is a row, each skipped beat a count in Redis."""

import time

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from celery_singleton_lock import SingletonTask, lock_skipped

from .models import ReportRun

#: How long one report takes: longer than the beat's period, so beats meet a running report.
REPORT_SECONDS = 2.5


@shared_task(base=SingletonTask, lock_key="report:{day}")
def nightly_report(day: str) -> int:
    run = ReportRun.objects.create(day=day, started=timezone.now())
    time.sleep(REPORT_SECONDS)  # the report's work
    run.finished = timezone.now()
    run.save()
    return run.pk


@lock_skipped.connect
def count_skipped(sender, **kwargs):
    if sender.name == nightly_report.name:
        client = redis.Redis.from_url(settings.REDIS_URL)
        key = f"{settings.PREFIX}skipped"
        client.incr(key)
        client.expire(key, 600)
        client.close()
