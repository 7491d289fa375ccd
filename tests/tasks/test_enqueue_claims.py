"""How long an enqueue-time claim lives, and claims whose message is no longer queued: a
purged queue, a countdown or eta far ahead, ``lock_queue_ttl``. Real Redis (broker, result
backend and locks) and real workers."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from celery.signals import before_task_publish
from click.testing import CliRunner, Result
from kombu.exceptions import OperationalError
from support.proxies import OutageProxy

from celery_singleton_lock import ConfigurationError, SingletonTask, admin
from celery_singleton_lock.celery.evidence import IN_FLIGHT_S
from celery_singleton_lock.cli import commands
from celery_singleton_lock.core.validate import MAX_SECONDS
from celery_singleton_lock.embedded import RedisServer

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30
TWENTY_YEARS = 20 * 365 * 24 * 3600


def claim_of(task: Any) -> admin.LockInfo:
    """The one claim the app's locks hold, as the admin lists it."""
    (info,) = [info for info in task.lock_client.locks() if info.owner]
    assert info.owner.startswith(admin.CLAIM_OWNER_PREFIX)
    return info


def run_celery(app: Celery, *args: str) -> Result:
    """``celery -A app locks ARGS``, in process."""
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return CliRunner().invoke(commands.locks, list(args), obj=obj, catch_exceptions=False)


def listed(app: Celery, timeout: float = 0) -> dict[str, dict[str, Any]]:
    """task id -> its lock object, as ``celery locks list --json`` prints it."""
    result = run_celery(app, "--timeout", str(timeout), "list", "--json")
    assert result.exit_code in (0, 1), result.output
    return {item["task_id"]: item for item in json.loads(result.stdout)}


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def remaining(info: admin.LockInfo) -> float:
    assert info.lease_remaining_s is not None
    return info.lease_remaining_s


# -- how long a claim lives ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_options", "conf", "countdown", "life"),
    [
        pytest.param({}, {}, None, 300.0, id="default"),
        pytest.param({"lock_queue_ttl": 40}, {}, 100, 140.0, id="task-option-after-countdown"),
        pytest.param({}, {"singleton_lock_queue_ttl": 20}, None, 20.0, id="setting"),
    ],
)
def test_a_claim_lives_until_the_call_may_run_plus_lock_queue_ttl(
    celery_lock_app: Celery,
    lock_prefix: str,
    task_options: dict[str, Any],
    conf: dict[str, Any],
    countdown: float | None,
    life: float,
) -> None:
    celery_lock_app.conf.update(conf)

    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True, **task_options)
    def sync(customer: int) -> int:
        return customer

    queued = sync.apply_async((5,), countdown=countdown, queue=f"{lock_prefix}unconsumed")
    info = claim_of(sync)
    assert (info.task_id, info.state) == (queued.id, admin.QUEUED)
    assert life - 5 < remaining(info) <= life  # not the run's lock_ttl (3600 s)
    assert sync.delay(5).id == queued.id  # still deduplicated meanwhile


@pytest.mark.parametrize(
    "when",
    [
        pytest.param({"countdown": TWENTY_YEARS}, id="countdown-20-years"),
        pytest.param(
            {"eta": datetime.datetime(2100, 1, 1, tzinfo=datetime.timezone.utc)}, id="eta-2100"
        ),
    ],
)
def test_a_call_scheduled_beyond_the_longest_expiry_is_claimed_until_then(
    celery_lock_app: Celery, lock_prefix: str, when: dict[str, Any]
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    queued = sync.apply_async((5,), queue=f"{lock_prefix}unconsumed", **when)
    info = claim_of(sync)
    assert info.task_id == queued.id
    assert MAX_SECONDS - 60 < remaining(info) <= MAX_SECONDS
    assert sync.apply_async((5,), queue=f"{lock_prefix}unconsumed", **when).id == queued.id


def test_a_retry_scheduled_beyond_the_longest_expiry_keeps_the_lock_handed_to_it(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, lock_on_enqueue=True)
    def later(self: Any, customer: int) -> int:
        raise self.retry(countdown=TWENTY_YEARS)

    with in_process_worker(celery_lock_app):
        first = later.delay(5)
        # The run hands its lock to attempt 1 (not dropped for an expiry Redis cannot take).
        wait_until(
            lambda: (
                [info.owner for info in later.lock_client.locks()]
                == [f"{admin.CLAIM_OWNER_PREFIX}{first.id}:1"]
            ),
            "the lock handed over to the retry",
        )
        assert MAX_SECONDS - 60 < remaining(claim_of(later)) <= MAX_SECONDS
        assert later.delay(5).id == first.id
        celery_lock_app.control.revoke(first.id)


@pytest.mark.parametrize("bad", [0, -1, "300", True, float("inf"), float("nan"), 2 * MAX_SECONDS])
def test_bad_lock_queue_ttl_is_refused_naming_it(celery_lock_app: Celery, bad: Any) -> None:
    class Fine(SingletonTask):
        lock_on_enqueue = True
        lock_queue_ttl = 30  # a known option: only bad values are refused

    with pytest.raises(ConfigurationError) as info:

        class Sync(SingletonTask):
            name = "jobs.sync"
            lock_on_enqueue = True
            lock_queue_ttl = bad

    assert info.value.argument == "jobs.sync.lock_queue_ttl"
    assert "unknown" not in str(info.value)

    celery_lock_app.conf.singleton_lock_queue_ttl = bad

    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def job() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.delay()
    assert info.value.argument == "singleton_lock_queue_ttl"
    assert celery_lock_app.backend.client.llen(celery_lock_app.conf.task_default_queue) == 0


# -- claims of messages no longer queued -----------------------------------------------------


def test_a_purged_queue_leaves_claims_that_clear_unqueued_removes(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, lock_prefix: str
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    queued = sync.delay(5)
    assert sync.delay(5).id == queued.id
    claim = listed(celery_lock_app)[queued.id]
    assert (claim["state"], claim["task_state"]) == ("queued", "PENDING")
    assert claim["evidence"] == f"in queue {lock_prefix}queue; result backend: PENDING"
    assert claim["age_s"] is not None and claim["age_s"] >= 0

    assert celery_lock_app.control.purge() == 1  # what `celery purge` does
    assert sync.delay(5).id == queued.id  # the claim outlived its message
    # Young claims are left alone (their message may be on its way): poll past that.
    wait_until(lambda: listed(celery_lock_app)[queued.id]["state"] == "stale", "stale claim")
    assert listed(celery_lock_app)[queued.id]["evidence"].startswith("not queued")
    cleared = run_celery(celery_lock_app, "--timeout", "0", "clear", "--unqueued", "--yes")
    assert cleared.exit_code == 0, cleared.output
    assert "cleared 1 of 1" in cleared.stdout
    assert listed(celery_lock_app) == {}

    with in_process_worker(celery_lock_app):
        fresh = sync.delay(5)
        assert fresh.id != queued.id
        assert fresh.get(timeout=TIMEOUT) == 5


def wait_for_settled_claims(app: Celery) -> None:
    """Until every claim is older than a message in flight and a worker answers."""
    wait_until(
        lambda: all(item["age_s"] >= IN_FLIGHT_S for item in listed(app).values()),
        "claims older than a message in flight",
    )
    wait_until(lambda: bool(app.control.inspect(timeout=1).ping()), "worker answers")


def test_clear_unqueued_leaves_claims_whose_message_waits_in_a_queue_or_on_a_worker(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, lock_prefix: str
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    with in_process_worker(celery_lock_app):
        waiting = sync.apply_async((1,), queue=f"{lock_prefix}unconsumed")
        # The worker receives it and holds it until its countdown (unacknowledged).
        scheduled = sync.apply_async((2,), countdown=120)
        wait_for_settled_claims(celery_lock_app)
        refused = run_celery(celery_lock_app, "--timeout", "1", "clear", "--unqueued", "--yes")
        assert refused.exit_code == 1, refused.output
        found = listed(celery_lock_app, timeout=1)
        assert found[waiting.id]["state"] == "queued"
        assert found[waiting.id]["evidence"].startswith(f"in queue {lock_prefix}unconsumed")
        assert found[scheduled.id]["state"] == "queued"
        wait_until(  # a worker slow to answer leaves the broker's word: "delivered ..."
            lambda: listed(celery_lock_app, timeout=1)[scheduled.id]["evidence"].startswith(
                "scheduled on worker "
            ),
            "the worker to say it holds the scheduled call",
        )
        # Without asking the workers, the broker still has it as received, not acknowledged.
        assert listed(celery_lock_app)[scheduled.id]["evidence"].startswith("delivered")
        assert sync.delay(1).id == waiting.id and sync.delay(2).id == scheduled.id
        sync.app.control.revoke(scheduled.id)


def test_on_a_broker_that_cannot_be_read_only_purged_clears_claims_no_worker_holds(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, lock_redis_url: str
) -> None:
    # The in-memory transport stands for RabbitMQ here: its queues cannot be read without
    # consuming them, so only the workers and the result backend speak.
    celery_lock_app.conf.update(broker_url="memory://", singleton_lock_url=lock_redis_url)

    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    purged = sync.delay(1)
    assert celery_lock_app.control.purge() == 1
    with in_process_worker(celery_lock_app):
        scheduled = sync.apply_async((2,), countdown=120)
        wait_for_settled_claims(celery_lock_app)
        unsure = run_celery(celery_lock_app, "--timeout", "1", "clear", "--unqueued", "--yes")
        assert unsure.exit_code == 1, unsure.output  # not read, not known to be gone
        assert listed(celery_lock_app, timeout=1)[purged.id]["state"] == "queued"
        said = run_celery(
            celery_lock_app, "--timeout", "3", "clear", "--unqueued", "--purged", "--yes"
        )
        assert said.exit_code == 0, said.output
        assert "cleared 1 of 1" in said.stdout
        left = listed(celery_lock_app, timeout=3)
        assert list(left) == [scheduled.id]
        assert left[scheduled.id]["evidence"].startswith("scheduled on worker ")
        fresh = sync.delay(1)
        assert fresh.id != purged.id and fresh.get(timeout=TIMEOUT) == 1
        celery_lock_app.control.revoke(scheduled.id)


# -- a send that fails ------------------------------------------------------------------------


def test_a_send_that_failed_with_the_lock_redis_down_too_raises_the_sends_own_error(
    celery_lock_app: Celery, lock_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker's Redis, which holds the locks too (the default), becomes unreachable between
    the claim and the send: the claim cannot be released, and the caller gets the broker's
    error, not the lock's, with the claim logged. Once Redis answers again, the next call
    releases that claim first: it is sent, not answered with the task id never sent."""
    with RedisServer() as server:
        proxy = OutageProxy(server.port)
        try:
            celery_lock_app.conf.update(broker_url=proxy.url, task_publish_retry=False)

            @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
            def sync(customer: int) -> int:
                return customer

            unsent: list[str] = []

            def cut_redis_off(sender: Any = None, headers: Any = None, **_: Any) -> None:
                if sender == sync.name and not unsent:
                    unsent.append(headers["id"])
                    proxy.down()

            before_task_publish.connect(cut_redis_off, weak=False)
            try:
                with (
                    caplog.at_level("WARNING", logger="celery_singleton_lock.task"),
                    pytest.raises(OperationalError),
                ):
                    sync.apply_async((7,), queue=f"{lock_prefix}unconsumed")
            finally:
                before_task_publish.disconnect(cut_redis_off)
            assert f"[{unsent[0]}] was not sent and its claim on" in caplog.text
            proxy.up()
            sent = sync.apply_async((7,), queue=f"{lock_prefix}unconsumed")
            assert sent.id != unsent[0]
            assert claim_of(sync).task_id == sent.id
        finally:
            proxy.close()
