"""A Django project (tests/django_project) run as Django users run one: settings in the
``CELERY_`` namespace, a ``shared_task`` in a Django app, and a periodic report scheduled in
django-celery-beat's database, sent by a real ``celery beat`` to a real ``celery worker``.
The report takes longer than its period: its runs never overlap, and the beats that meet a
running report are skipped."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import redis
from support.waiting import wait_for

from celery_singleton_lock import LockClient

PROJECT = Path(__file__).resolve().parent.parent / "django_project"
TIMEOUT = 60.0
REPORT = "reports.tasks.nightly_report"


@pytest.fixture
def django_env(lock_redis_url: str, lock_prefix: str, tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "CSL_DJANGO_REDIS_URL": lock_redis_url,
        "CSL_DJANGO_PREFIX": lock_prefix,
        "CSL_DJANGO_DB": str(tmp_path / "db.sqlite3"),
    }


def django(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", "django", *args], env=env, check=True, timeout=TIMEOUT)


@pytest.fixture
def programs(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started ``celery`` programs; each is stopped, its process group and all, at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for program in started:
        os.killpg(program.pid, signal.SIGKILL)
        program.wait()


def start(
    programs: list[subprocess.Popen[bytes]], env: dict[str, str], log: Path, *args: str
) -> None:
    with log.open("wb") as out:
        programs.append(
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "proj", *args],
                cwd=log.parent,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )


def report_runs(database: str) -> list[tuple[datetime, datetime]]:
    """The finished report runs, (started, finished), in the order they started."""
    with sqlite3.connect(database, timeout=30) as db:
        rows = db.execute(
            "SELECT started, finished FROM reports_reportrun"
            " WHERE finished IS NOT NULL ORDER BY started"
        ).fetchall()
    return [(datetime.fromisoformat(a), datetime.fromisoformat(b)) for a, b in rows]


def test_a_beat_report_longer_than_its_period_never_overlaps(
    django_env: dict[str, str],
    programs: list[subprocess.Popen[bytes]],
    lock_redis_url: str,
    lock_prefix: str,
    tmp_path: Path,
) -> None:
    django(django_env, "migrate", "--verbosity", "0")
    django(django_env, "shell", "-c", "from reports.schedule import schedule_report as s; s()")
    queue = f"{lock_prefix}queue"
    start(
        programs, django_env, tmp_path / "worker.log",
        "worker", "-P", "threads", "-c", "2", "-Q", queue, "-n", f"dj-{uuid.uuid4().hex[:6]}@%h",
        "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "INFO",
    )  # fmt: skip
    start(programs, django_env, tmp_path / "beat.log", "beat", "-l", "INFO", "--max-interval", "1")

    # While a report runs, the admin lists its lock under the prefix Django's settings set.
    client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    try:
        held = wait_for(
            lambda: [info for info in client.locks() if info.name == "report:2026-11-24"],
            TIMEOUT,
            "a report run holding its lock",
        )
        assert held[0].task_name == REPORT and held[0].state == "live"
    finally:
        client.close()

    database = django_env["CSL_DJANGO_DB"]

    def three_runs() -> list[tuple[datetime, datetime]] | None:
        runs = report_runs(database)
        return runs if len(runs) >= 3 else None

    runs = wait_for(three_runs, TIMEOUT, "three finished report runs")
    for (_, finished), (started, _) in zip(runs, runs[1:], strict=False):
        assert started >= finished, runs  # one at a time
    skipped = redis.Redis.from_url(lock_redis_url).get(f"{lock_prefix}skipped")
    assert skipped is not None and int(skipped) >= 1  # beats met a running report
