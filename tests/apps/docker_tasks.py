"""The task the Docker smoke test runs in pytest-celery's worker container (copied there as
source by that worker's initial-content fixture, so it must stand alone)."""

from celery import shared_task

from celery_singleton_lock import SingletonTask


@shared_task(base=SingletonTask, lock_key="docker-smoke:{day}")
def smoke_report(day: str) -> str:
    return f"report {day}"
