"""celery/done_marks.py: a call whose attempt ended leaves a done mark, so a copy of its message
delivered later (a visibility timeout, a lost broker connection) is dropped instead of running
the body again; a run cut short (SIGKILL) leaves none, so its redelivered copy still runs.

Real workers: ``celery worker`` processes of tests/apps/fault_app.py (``acks_late``, a result
backend, an 8 s visibility timeout), and in-process workers for an app without a result
backend and for a retrying call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import redis
from apps.fault_app import RESULT_RELEASE_DELAY, gate_key
from celery import Celery
from celery.backends.redis import RedisBackend
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.chaos import Workers
from support.outcomes import Outcomes
from support.proxies import HoldingProxy
from support.waiting import wait_for

from celery_singleton_lock import LockClient, SingletonTask
from celery_singleton_lock.celery.sends import REQUEUES_HEADER, SEND_HEADER
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.exceptions import ConfigurationError

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 60.0
DROPPED = "dropped: attempt 0 of this task id ended already"


def done_mark(task: Any, args: tuple[Any, ...], task_id: str) -> tuple[bytes | None, int]:
    """The done mark of ``task_id`` in the slot of ``task``'s lock for ``args``: the highest
    attempt any send of it ended (None if none did; a delivery's note, ``?<id>``, is no
    attempt) and its remaining ms, as the lock Redis has it."""
    from celery_singleton_lock.celery.done_marks import DoneMark

    connection = task.lock_client.connection
    key = DoneMark.of(connection, task.make_lock(args), task_id, 0, 1.0).key
    fields = connection.redis.hgetall(key)
    ended = [value for field, value in fields.items() if not field.startswith(b"?")]
    highest = max(ended, key=int) if ended else None
    return highest, connection.redis.pttl(key)


# -- the mark on a real Redis ------------------------------------------------------------------


@pytest.fixture
def client(lock_redis_url: str, lock_prefix: str) -> Iterator[LockClient]:
    client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    yield client
    client.close()


def test_the_mark_keeps_the_highest_attempt_that_ended(client: LockClient) -> None:
    from celery_singleton_lock.celery.done_marks import DoneMark, read_ended, record

    connection = client.connection
    lease = client.lease("done:1")
    assert DoneMark.of(connection, lease, "t-1", 0, 1.0).key == (
        connection.keys("done:1").base + b"done:t-1"
    )
    later = DoneMark.of(connection, lease, "t-1", 2, 60.0)
    assert read_ended(connection, later) == -1
    record(connection, later)
    # A late or re-sent mark of an earlier attempt never lowers it; it only keeps it longer.
    record(connection, DoneMark.of(connection, lease, "t-1", 1, 120.0))
    assert read_ended(connection, later) == 2
    assert 60_000 < connection.redis.pttl(later.key) <= 120_000


def test_each_send_of_a_task_id_has_its_own_entry_and_a_message_with_none_reads_them_all(
    client: LockClient,
) -> None:
    """A replacement or a re-send under the same task id is another send (celery/sends.py):
    an attempt that ended in one send is no reason to drop another; a message that carries no
    send id may be a copy of any of them."""
    from celery_singleton_lock.celery.done_marks import DoneMark, read_ended, record

    connection = client.connection
    lease = client.lease("done:sends")
    first = DoneMark.of(connection, lease, "t-s", 1, 60.0, send="aaaa")
    record(connection, first)
    assert read_ended(connection, DoneMark.of(connection, lease, "t-s", 0, 60.0, send="bbbb")) == -1
    assert read_ended(connection, first) == 1
    record(connection, DoneMark.of(connection, lease, "t-s", 0, 60.0, send="bbbb"))
    assert read_ended(connection, DoneMark.of(connection, lease, "t-s", 0, 60.0)) == 1
    assert read_ended(connection, DoneMark.of(connection, lease, "t-s", 0, 60.0, send="bbbb")) == 0


def test_a_release_writes_the_mark_and_frees_the_lock_and_an_acquire_reads_it(
    client: LockClient,
) -> None:
    from celery_singleton_lock.celery import done_marks

    connection = client.connection
    lease = client.lease("done:2", ttl=10)
    mark = done_marks.DoneMark.of(connection, lease, "t-2", 0, 30.0)
    assert done_marks.acquire(connection, lease, 0.0, mark) == (True, -1)
    done_marks.release(connection, lease, 0.0, mark)
    assert not lease.held and not client.holders("done:2")
    assert done_marks.read_ended(connection, mark) == 0
    assert done_marks.acquire(connection, lease, 0.0, mark) == (True, 0)
    # A release with nothing to free (not held) still marks the attempt.
    lease.release()
    retry = done_marks.DoneMark.of(connection, lease, "t-2", 1, 30.0)
    with pytest.raises(Exception, match="not held"):
        done_marks.release(connection, lease, 0.0, retry)
    assert done_marks.read_ended(connection, mark) == 1


def test_a_release_with_its_mark_runs_once_after_a_script_flush() -> None:
    """The lock scripts loaded again by other calls, the joined ones (lock script and mark
    in one) not: each is loaded when refused NOSCRIPT and runs once, so the release is not
    run twice (the second would answer 'not held'). A server of its own: the flush must not
    touch other tests' scripts."""
    from celery_singleton_lock.celery import done_marks

    with RedisServer() as server:
        client = LockClient.from_url(server.url, prefix="csltest:flush:")
        try:
            connection = client.connection
            connection.redis.script_flush()
            other = client.lease("done:other")
            assert other.acquire(0.0)
            other.release()
            lease = client.lease("done:3", ttl=10)
            mark = done_marks.DoneMark.of(connection, lease, "t-3", 0, 30.0)
            assert done_marks.acquire(connection, lease, 0.0, mark) == (True, -1)
            done_marks.release(connection, lease, 0.0, mark)
            assert done_marks.read_ended(connection, mark) == 0
            assert not client.holders("done:3")
        finally:
            client.close()


def test_a_release_whose_reply_was_lost_and_sent_again_leaves_one_mark(client: LockClient) -> None:
    """The mark and the release ran, their reply was lost, redis-py's retry sent the
    call again: the mark is written again as it was (never a second attempt), and the
    lock stays free; the release sent again finds the first one's trace: released, not
    lost."""
    from celery_singleton_lock.celery import done_marks

    port = int(client.connection.redis.connection_pool.connection_kwargs["port"])
    proxy = HoldingProxy(port)
    via = redis.Redis(port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 1))
    lossy = LockClient(via, prefix=client.connection.prefix)
    try:
        connection = lossy.connection
        # Every script loaded first: the reply held is the release's.
        warm = lossy.lease("done:warm", ttl=10)
        warm_mark = done_marks.DoneMark.of(connection, warm, "t-warm", 0, 30.0)
        assert done_marks.acquire(connection, warm, 0.0, warm_mark)[0]
        done_marks.release(connection, warm, 0.0, warm_mark)
        lease = lossy.lease("done:lost", ttl=10)
        mark = done_marks.DoneMark.of(connection, lease, "t-lost", 0, 30.0)
        assert done_marks.acquire(connection, lease, 0.0, mark) == (True, -1)
        proxy.hold_next_reply()
        done_marks.release(connection, lease, 0.0, mark)
        assert proxy.holding.is_set()
        assert not lease.held and not lease.lost and not client.holders("done:lost")
        assert client.connection.redis.hgetall(mark.key) == {b"": b"0"}
        assert 0 < client.connection.redis.pttl(mark.key) <= 30_000
    finally:
        lossy.close()
        proxy.close()


def test_the_marks_life_follows_the_visibility_timeout_or_the_setting() -> None:
    from celery_singleton_lock.celery.done_marks import mark_ttl
    from celery_singleton_lock.celery.options import AppSettings

    app = Celery(set_as_current=False)
    assert mark_ttl(app) == 7200.0  # two of the Redis transport's default hour
    app.conf.broker_transport_options = {"visibility_timeout": 8}
    assert mark_ttl(app) == 16.0
    app.conf.singleton_lock_done_mark_ttl = 30
    assert mark_ttl(app) == 30.0
    app.conf.singleton_lock_done_mark_ttl = 0  # no marks
    assert mark_ttl(app) == 0.0
    app.conf.update(singleton_lock_url="redis://127.0.0.1:1/0")
    AppSettings.from_conf(app.conf)
    for bad in (-1, "soon", float("inf"), True):
        app.conf.singleton_lock_done_mark_ttl = bad
        with pytest.raises(ConfigurationError, match="singleton_lock_done_mark_ttl"):
            AppSettings.from_conf(app.conf)


def test_where_marks_are_written_is_a_setting_of_two_values() -> None:
    from celery_singleton_lock.celery.options import AppSettings

    app = Celery(set_as_current=False)
    app.conf.update(singleton_lock_url="redis://127.0.0.1:1/0")
    for good in ("copies", "always"):
        app.conf.singleton_lock_done_marks = good
        AppSettings.from_conf(app.conf)
    for bad in ("sometimes", "Always", True, 1):
        app.conf.singleton_lock_done_marks = bad
        with pytest.raises(ConfigurationError, match="singleton_lock_done_marks") as info:
            AppSettings.from_conf(app.conf)
        assert "'copies', 'always'" in str(info.value)


# -- real `celery worker` processes ------------------------------------------------------------


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Workers]:
    with RedisServer() as broker, RedisServer() as lock:
        workers = Workers(lock.url, broker.url, f"csltest:done:{broker.port}:", tmp_path)
        try:
            yield workers
        finally:
            workers.close()


#: The send id the tests give an original message, so that a copy sent by hand carries it,
#: as every copy of a message does (a broker's redelivery, a re-queue): a message with no send
#: id and no mark of a delivery again is a new send, not a copy (sends.unmarked_is_new).
ORIGINAL = {SEND_HEADER: "original"}


def events(pool: Workers, **match: Any) -> list[dict[str, Any]]:
    return [e for e in pool.events() if all(e.get(k) == v for k, v in match.items())]


@pytest.mark.timeout(180)
def test_a_copy_delivered_after_its_original_ended_is_dropped_not_run_again(
    pool: Workers,
) -> None:
    worker = pool.start(concurrency=1)
    pool.wait_ready(worker)
    task = pool.app.tasks["fault.chaos"]
    args = ("kd", 0.1)
    result = task.apply_async(args, headers=ORIGINAL)
    assert result.get(timeout=TIMEOUT) > 0
    value, pttl = done_mark(task, args, result.id)
    assert value == b"0" and 0 < pttl <= 16_000  # two visibility timeouts of 8 s
    # The same message again, after the run released its lock: the lock is free, and no
    # re-queue brought this copy back (the result backend is not asked about it).
    pool.app.send_task(task.name, args, task_id=result.id, headers=ORIGINAL)
    wait_for(lambda: DROPPED in worker.log_tail(200), TIMEOUT, "the copy to be dropped")
    assert len(events(pool, event="start", task_id=result.id)) == 1
    assert result.state == "SUCCESS"


@pytest.mark.timeout(180)
def test_a_sigkilled_run_leaves_no_mark_and_its_redelivered_copy_runs(pool: Workers) -> None:
    first_worker = pool.start(concurrency=1)
    pool.wait_ready(first_worker)
    task = pool.app.tasks["fault.gated"]
    args = ("kk", TIMEOUT)
    result = task.apply_async(args)
    wait_for(lambda: events(pool, event="start", task_id=result.id), TIMEOUT, "a run")
    first_worker.kill()
    assert done_mark(task, args, result.id)[0] is None  # its body never ended
    second_worker = pool.start(concurrency=1)
    pool.wait_ready(second_worker)
    # The message comes back (visibility timeout) and runs, once the dead run's lease is
    # taken over or runs out.
    wait_for(lambda: events(pool, event="start", task_id=result.id)[1:], TIMEOUT * 2, "the copy")
    pool.broker.set(gate_key(pool.prefix, "kk"), 1, ex=600)
    assert result.get(timeout=TIMEOUT)["locked"]
    assert len(events(pool, event="end", task_id=result.id)) == 1
    assert done_mark(task, args, result.id)[0] == b"0"


@pytest.mark.timeout(180)
def test_a_run_killed_before_its_result_was_stored_leaves_no_mark_and_its_copy_completes(
    pool: Workers,
) -> None:
    # The mark is written with the release, before Celery stores the outcome: a copy that
    # finds it with no outcome stored is re-queued once, then runs, never leaving the call
    # without an outcome.
    worker = pool.start(concurrency=1)
    pool.wait_ready(worker)
    task = pool.app.tasks["fault.dies_before_result"]
    result = task.apply_async(("kr",))
    pid = result.get(timeout=TIMEOUT * 2)
    starts = events(pool, event="start", task_id=result.id)
    assert len(starts) == 2 and starts[0]["pid"] != pid == starts[1]["pid"]
    assert len(events(pool, event="end", task_id=result.id)) == 2
    assert done_mark(task, ("kr",), result.id)[0] == b"0"


@pytest.mark.timeout(180)
def test_a_run_killed_before_its_result_was_stored_in_its_release_delay_is_completed_after_it(
    pool: Workers,
) -> None:
    # The run that ended left its release delay and its mark, and no outcome. Its copy comes
    # back (re-queued once) while that delay still stands: it is the call's last chance of an
    # outcome, so it waits the delay out and runs, rather than being ignored as a copy of
    # a call that ended.
    worker = pool.start(concurrency=1)
    pool.wait_ready(worker)
    task = pool.app.tasks["fault.dies_before_result_delayed"]
    result = task.apply_async(("kd",))
    pid = result.get(timeout=TIMEOUT * 2)
    starts = events(pool, event="start", task_id=result.id)
    assert len(starts) == 2 and starts[0]["pid"] != pid == starts[1]["pid"]
    # Not before the first run's release delay was over.
    assert starts[1]["time"] - starts[0]["time"] >= RESULT_RELEASE_DELAY
    assert done_mark(task, ("kd",), result.id)[0] == b"0"


# -- in-process workers ------------------------------------------------------------------------


def test_without_a_result_backend_a_late_copy_is_dropped(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    # The copies below are sent by hand: no setting of this app makes them.
    celery_lock_app.conf.singleton_lock_done_marks = "always"
    celery_lock_app.conf.result_backend = None
    client, runs_key = runs

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, ignore_result=True, lock_key="nb:{key}"
    )  # fmt: skip
    def job(self: Any, key: str) -> None:
        client.rpush(runs_key, self.request.retries or 0)

    with in_process_worker(celery_lock_app, concurrency=2):
        first = job.apply_async(("a",), headers=ORIGINAL)
        assert outcomes.wait(1) == ["SUCCESS"]
        celery_lock_app.send_task(job.name, ("a",), task_id=first.id, headers=ORIGINAL)
        assert outcomes.wait(2) == ["SUCCESS", "IGNORED"]
    assert client.lrange(runs_key, 0, -1) == [b"0"]


def test_a_message_with_no_send_id_under_a_used_task_id_is_a_new_send_and_runs(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    """A client that does not stamp send ids (``send_task`` from a process without the task
    class; a task converted by ``singleton_lock_tasks`` in the worker only) re-sends a task
    id that ran: the message carries no mark of a delivery again on a broker that marks them
    (Redis), so it is a new send and runs, though the task id's done mark says attempt 0
    ended. Re-queued by this package (a header), the same message is a copy: dropped."""
    celery_lock_app.conf.singleton_lock_done_marks = "always"
    celery_lock_app.conf.result_backend = None
    client, runs_key = runs

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, ignore_result=True, lock_key="ns:{key}"
    )  # fmt: skip
    def job(self: Any, key: str) -> None:
        client.rpush(runs_key, key)

    with in_process_worker(celery_lock_app, concurrency=2):
        first = celery_lock_app.send_task(job.name, ("a",))
        assert outcomes.wait(1) == ["SUCCESS"]
        assert done_mark(job, ("a",), first.id)[0] == b"0"
        celery_lock_app.send_task(job.name, ("a",), task_id=first.id)
        assert outcomes.wait(2) == ["SUCCESS", "SUCCESS"]
        celery_lock_app.send_task(
            job.name, ("a",), task_id=first.id, headers={REQUEUES_HEADER: 1}
        )  # fmt: skip
        assert outcomes.wait(3) == ["SUCCESS", "SUCCESS", "IGNORED"]
    assert client.lrange(runs_key, 0, -1) == [b"a", b"a"]


def test_with_done_marks_off_a_run_leaves_none_and_a_late_copy_runs_again(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    celery_lock_app.conf.update(result_backend=None, singleton_lock_done_mark_ttl=0)
    client, runs_key = runs

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, ignore_result=True, lock_key="off:{key}"
    )  # fmt: skip
    def job(self: Any, key: str) -> None:
        client.rpush(runs_key, self.request.retries or 0)

    with in_process_worker(celery_lock_app, concurrency=2):
        first = job.delay("a")
        assert outcomes.wait(1) == ["SUCCESS"]
        done = job.lock_client.connection.keys("off:a").base + b"done:*"
        assert list(job.lock_client.redis.scan_iter(match=done)) == []
        celery_lock_app.send_task(job.name, ("a",), task_id=first.id)
        assert outcomes.wait(2) == ["SUCCESS", "SUCCESS"]
    assert client.lrange(runs_key, 0, -1) == [b"0", b"0"]


def test_a_copy_of_an_attempt_that_retried_is_dropped_and_the_retry_runs_once(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    # The copies below are sent by hand: no setting of this app makes them.
    celery_lock_app.conf.singleton_lock_done_marks = "always"
    """``lock_conflict="retry"``: attempt 0 met another holder and retried as attempt 1; a
    copy of attempt 0 (re-queued earlier, or redelivered) that comes once the lock is free
    must not run beside attempt 1."""
    client, runs_key = runs

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, lock_key="rt:{key}",
        lock_conflict="retry", lock_retry_countdown=4, max_retries=3,
    )  # fmt: skip
    def job(self: Any, key: str) -> int:
        client.rpush(runs_key, self.request.retries or 0)
        return int(self.request.retries or 0)

    blocker = job.make_lock(("r",), owner_info={"task_id": "blocker"})
    assert blocker.acquire(0.0)
    try:
        with in_process_worker(celery_lock_app, concurrency=2):
            result = job.apply_async(("r",), headers=ORIGINAL)
            assert outcomes.wait(1) == ["RETRY"]
            blocker.release()
            celery_lock_app.send_task(job.name, ("r",), task_id=result.id, headers=ORIGINAL)
            assert outcomes.wait(2) == ["RETRY", "IGNORED"]  # before attempt 1's countdown
            assert result.get(timeout=TIMEOUT) == 1
            assert outcomes.wait(3) == ["RETRY", "IGNORED", "SUCCESS"]
    finally:
        if blocker.held:
            blocker.release()
    assert client.lrange(runs_key, 0, -1) == [b"1"]


def test_a_copy_of_an_attempt_that_retried_from_its_body_is_dropped_after_the_retry_ran(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    # The copies below are sent by hand: no setting of this app makes them.
    celery_lock_app.conf.singleton_lock_done_marks = "always"
    """Attempt 0 handed its lock to attempt 1 (``self.retry``), which ran and let it go: a
    late copy of attempt 0 finds attempt 1's mark (a later attempt ended) and is dropped."""
    client, runs_key = runs

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, lock_key="rb:{key}", max_retries=1
    )  # fmt: skip
    def job(self: Any, key: str) -> int:
        client.rpush(runs_key, self.request.retries or 0)
        if not self.request.retries:
            raise self.retry(countdown=0)
        return 1

    with in_process_worker(celery_lock_app, concurrency=2):
        result = job.apply_async(("b",), headers=ORIGINAL)
        assert result.get(timeout=TIMEOUT) == 1
        # Attempt 1 may end before attempt 0's own end is reported.
        assert sorted(outcomes.wait(2)) == ["RETRY", "SUCCESS"]
        assert done_mark(job, ("b",), result.id)[0] == b"1"
        celery_lock_app.send_task(job.name, ("b",), task_id=result.id, headers=ORIGINAL)
        assert outcomes.wait(3)[2] == "IGNORED"
    assert client.lrange(runs_key, 0, -1) == [b"0", b"1"]


def test_a_copy_requeued_behind_its_original_before_is_requeued_once_more_for_its_outcome(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    # The copies below are sent by hand: no setting of this app makes them.
    celery_lock_app.conf.singleton_lock_done_marks = "always"
    """A copy re-queued earlier behind its live original (one re-queue counted) comes back
    between the original's release and the storing of its result: it is re-queued for the
    missing outcome, not run at once, and dropped once the outcome is there."""
    client, runs_key = runs
    storing, store = threading.Event(), threading.Event()

    class SlowToStore(RedisBackend):  # type: ignore[misc]
        """Holds the first result it is asked to store back until ``store`` is set."""

        def mark_as_done(self, task_id: str, *args: Any, **kwargs: Any) -> Any:
            if not storing.is_set():
                storing.set()
                assert store.wait(TIMEOUT)
            return super().mark_as_done(task_id, *args, **kwargs)

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, lock_key="rq:{key}", lock_lease=1,
        backend=SlowToStore(app=celery_lock_app, url=celery_lock_app.conf.result_backend),
    )  # fmt: skip
    def job(self: Any, key: str) -> int:
        client.rpush(runs_key, self.request.retries or 0)
        return 1

    try:
        with in_process_worker(celery_lock_app, concurrency=2):
            first = job.delay("q")
            assert storing.wait(TIMEOUT)  # released and marked; its result not stored yet
            celery_lock_app.send_task(
                job.name, ("q",), task_id=first.id, headers={REQUEUES_HEADER: 1}
            )
            assert outcomes.wait(1) == ["IGNORED"]  # re-queued, its body not run
            store.set()
            assert first.get(timeout=TIMEOUT) == 1
            assert outcomes.wait(3) == ["IGNORED", "SUCCESS", "IGNORED"]  # back, and dropped
    finally:
        store.set()
    assert client.lrange(runs_key, 0, -1) == [b"0"]


# -- where a mark is written -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "send", "marked"),
    [
        ({}, {}, False),
        ({"acks_late": True}, {}, True),
        ({}, {"countdown": 0.1}, True),
        ({}, {"headers": {REQUEUES_HEADER: 1}}, True),
    ],
    ids=["acked-at-start", "acks-late", "countdown", "requeued"],
)
def test_a_mark_is_written_only_where_a_copy_can_come(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    options: dict[str, Any],
    send: dict[str, Any],
    marked: bool,
) -> None:
    """Acknowledged as its run starts, with no eta and not a copy, a call leaves no key once
    it ended (not even its delivery's note); where a copy of its message can still come, its
    mark stays for the mark's life."""

    @celery_lock_app.task(base=SingletonTask, shared=False, **options)
    def job(day: str) -> str:
        return day

    with in_process_worker(celery_lock_app):
        result = job.apply_async(("d",), **send)
        assert result.get(timeout=TIMEOUT) == "d"
    value, pttl = done_mark(job, ("d",), result.id)
    if marked:
        assert value == b"0" and pttl > 0
    else:
        assert value is None and pttl == -2  # no key at all
