"""SingletonTask in a real ``celery worker`` while its lock Redis goes down and comes back
empty. The broker, the result backend and what the tasks record are on a second Redis that
stays up (tests/apps/fault_app.py), so only the locks go away.

Nothing is restarted but the lock server: the same worker processes go on taking locks once
it is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.chaos import Worker, Workers
from support.waiting import wait_for

from celery_singleton_lock import LockBackendError
from celery_singleton_lock.core.keys import lock_keys
from celery_singleton_lock.embedded import RedisServer

TIMEOUT = 30.0


class Outage:
    def __init__(self, lock: RedisServer, pool: Workers, worker: Worker) -> None:
        self.lock, self.pool, self.worker = lock, pool, worker

    def task(self, name: str) -> Any:
        return self.pool.app.tasks[f"fault.{name}"]

    def events(self, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.pool.events() if all(e.get(k) == v for k, v in match.items())]

    def wait_event(self, timeout: float = TIMEOUT, **match: Any) -> dict[str, Any]:
        return wait_for(lambda: self.events(**match), timeout, f"an event {match}")[0]

    def now(self) -> float:
        seconds, micros = self.pool.broker.time()
        return int(seconds) + int(micros) / 1_000_000


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    with RedisServer() as broker, RedisServer() as lock:
        log_dir: Path = tmp_path_factory.mktemp("outage-workers")
        pool = Workers(lock.url, broker.url, f"csltest:outage:{broker.port}:", log_dir)
        try:
            worker = pool.start(concurrency=3)
            pool.wait_ready(worker)
            yield Outage(lock, pool, worker)
        finally:
            pool.close()


@pytest.fixture
def lock_up(outage: Outage) -> Iterator[Outage]:
    """The module's worker, alive, with its lock Redis up before and after the test."""
    outage.lock.start()
    assert outage.worker.alive(), outage.worker.log_tail()
    yield outage
    outage.lock.start()


@pytest.mark.timeout(120)
def test_lock_redis_down_fails_or_runs_unlocked_and_work_resumes_when_it_is_back(
    lock_up: Outage,
) -> None:
    o = lock_up
    holder = o.task("hold").apply_async(("down", 60))
    started = o.wait_event(event="start", task_id=holder.id)
    waiter = o.task("wait_hold").apply_async(("down", 0))  # lock_wait=60
    channel = lock_keys(o.pool.prefix, "job:down").channel
    lock_redis = o.pool.app.tasks["fault.hold"].lock_client.redis
    wait_for(
        lambda: dict(lock_redis.pubsub_numsub(channel)).get(channel, 0) >= 1,
        TIMEOUT,
        "the waiter to block on the lock",
    )

    o.lock.stop()
    stopped_at = o.now()
    # The blocked waiter fails at once with a clear error instead of sitting out its wait.
    with pytest.raises(LockBackendError) as failed:
        waiter.get(timeout=TIMEOUT, propagate=True)
    assert f"127.0.0.1:{o.lock.port}" in str(failed.value)
    # The holder finds its lease lost once it could have run out (lease 3 s): marked
    # "unreachable" by a heartbeat tick, or "expired" by the task's own look at its deadline
    # if that comes first.
    outcome = holder.get(timeout=TIMEOUT)
    assert outcome["locked"] and outcome["lost"] in ("unreachable", "expired"), outcome
    ended = o.wait_event(event="end", task_id=holder.id)
    assert 3.0 * 0.6 <= ended["time"] - stopped_at < 3.0 + 5, (ended, stopped_at)
    signalled = o.wait_event(event="lost", task_id=holder.id)
    assert signalled["reason"] == outcome["lost"] and signalled["token"] == started["token"]

    # New runs while it is down: "fail" fails the run, "run" runs unlocked with a WARNING,
    # autoretry_for=(LockBackendError,) retries until Redis is back.
    fail = o.task("hold").apply_async(("other", 0))
    with pytest.raises(LockBackendError):
        fail.get(timeout=TIMEOUT, propagate=True)
    unlocked = o.task("hold_or_run").apply_async(("other", 0)).get(timeout=TIMEOUT)
    assert unlocked["locked"] is False and unlocked["token"] is None
    wait_for(lambda: "UNLOCKED" in o.worker.log_tail(400), TIMEOUT, "the UNLOCKED warning")
    assert "WARNING" in next(
        line for line in o.worker.log_tail(400).splitlines() if "UNLOCKED" in line
    )
    retrying = o.task("retrying").apply_async(("retried", 0))
    wait_for(lambda: retrying.state == "RETRY", TIMEOUT, "the run to be retried")
    assert o.pool.app.control.ping(destination=[o.worker.name], timeout=5), "worker is gone"

    # Back (empty), with nothing restarted: the same worker takes locks again.
    o.lock.start()
    resumed = o.task("hold").apply_async(("down", 0)).get(timeout=TIMEOUT)
    # A skipped run names the holder's task id: say which of the calls above it was.
    calls = {"holder": holder.id, "waiter": waiter.id, "fail": fail.id, "retrying": retrying.id}
    assert resumed.get("locked") and resumed.get("lost") is None, (resumed, calls)
    assert resumed["token"] > started["token"]
    after = retrying.get(timeout=TIMEOUT)
    assert after["locked"] and after["retries"] >= 1, after
    assert o.worker.alive()


@pytest.mark.timeout(120)
def test_lock_redis_restarted_empty_is_found_at_the_next_heartbeat_tick(lock_up: Outage) -> None:
    o = lock_up
    holder = o.task("hold").apply_async(("empty", 60))  # lease 3 s: a tick every second
    started = o.wait_event(event="start", task_id=holder.id)
    o.lock.stop()
    o.lock.start()
    restarted_at = o.now()
    # The next renewal finds the lease gone: "expired" (not "unreachable": Redis answered),
    # and before the 3 s lease could have run out on its own.
    outcome = holder.get(timeout=TIMEOUT)
    assert outcome["lost"] == "expired", outcome
    ended = o.wait_event(event="end", task_id=holder.id)
    assert ended["time"] - restarted_at < 3.0, (ended["time"], restarted_at)
    signalled = o.wait_event(event="lost", task_id=holder.id)
    assert signalled["reason"] == "expired" and signalled["token"] == started["token"]
    # The key is free for the next run, with a larger fencing token.
    again = o.task("hold").apply_async(("empty", 0)).get(timeout=TIMEOUT)
    assert again["locked"] and again["token"] > started["token"]


@pytest.mark.timeout(120)
def test_a_run_with_the_lock_redis_down_logs_one_error_without_the_clean_up_noise(
    lock_up: Outage,
) -> None:
    o = lock_up
    o.lock.stop()
    logged_before = len(o.worker.log.read_text(errors="replace").splitlines())
    run = o.task("hold").apply_async(("quiet", 0))  # no lock_wait: one try
    with pytest.raises(LockBackendError):
        run.get(timeout=TIMEOUT, propagate=True)

    def logged() -> list[str]:
        return o.worker.log.read_text(errors="replace").splitlines()[logged_before:]

    # Celery logs the failure after it stored it: wait for its line.
    wait_for(
        lambda: any(run.id in line and "ERROR/" in line for line in logged()),
        TIMEOUT,
        "the run's failure",
    )
    lines = logged()
    # One message, the run's ERROR (Celery's, with the package's advice): nothing from the
    # clean-up of the failed attempt, which met the same dead server.
    messages = [line for line in lines if "WARNING/" in line or "ERROR/" in line]
    assert len(messages) == 1, "\n".join(lines)
    assert "raised unexpected: LockBackendError" in messages[0], messages
    assert "fault.hold did not run" in messages[0], messages
    assert not any("could not withdraw" in line for line in lines), "\n".join(lines)
