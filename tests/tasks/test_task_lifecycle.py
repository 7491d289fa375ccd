"""SingletonTask across Celery's task lifecycle on a real in-process worker: retries of
enqueue-locked tasks, canvases, revoked messages, redelivered copies, exhausted retries, what
a skipped run says about the holder, and the "until_start" and "debounce" enqueue modes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.signals import task_postrun, task_retry, task_revoked
from celery.utils import uuid

from celery_singleton_lock import SingletonTask, admin, is_skipped
from celery_singleton_lock.celery import claims, evidence
from celery_singleton_lock.celery.testing import TaskLocks
from celery_singleton_lock.core.holder import flatten

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30


def lock_fields(task: Any, *args: Any) -> dict[str, str]:
    """The lock hash a call of ``task`` with these arguments takes, decoded."""
    client = task.lock_client
    raw = flatten(client.redis.hgetall(client.connection.keys(task.lock_name(args)).lock))
    return {key.decode(): value.decode() for key, value in raw.items()}


@contextmanager
def task_log() -> Iterator[list[str]]:
    """The messages ``celery_singleton_lock.task`` logs at INFO and above meanwhile (a handler
    of its own: the worker's logging setup may change what pytest's caplog sees)."""
    messages: list[str] = []
    logger = logging.getLogger("celery_singleton_lock.task")

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler, level = Collect(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextmanager
def postrun_states() -> Iterator[dict[str, list[str]]]:
    """task id -> the states ``task_postrun`` reported for it, in order."""
    seen: dict[str, list[str]] = {}
    lock = threading.Lock()

    def record(task_id: str, state: str | None = None, **_: Any) -> None:
        with lock:
            seen.setdefault(task_id, []).append(str(state))

    task_postrun.connect(record, weak=False)
    try:
        yield seen
    finally:
        task_postrun.disconnect(record)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- item: retries of enqueue-locked tasks ---------------------------------------------------


def test_retry_of_an_enqueue_locked_task_runs(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    attempts: list[int] = []

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, lock_on_enqueue=True)
    def flaky(self: Any, customer: int) -> int:
        attempts.append(self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=0.2)
        return customer

    with in_process_worker(celery_lock_app):
        result = flaky.delay(7)
        assert result.get(timeout=TIMEOUT) == 7
    assert attempts == [0, 1]
    assert not task_locks.is_held(flaky, 7)


def test_autoretry_of_an_enqueue_locked_task_runs(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    attempts: list[int] = []

    @celery_lock_app.task(
        base=SingletonTask,
        shared=False,
        bind=True,
        lock_on_enqueue=True,
        autoretry_for=(ConnectionError,),
        retry_kwargs={"countdown": 0.2, "max_retries": 3},
        retry_backoff=False,
    )
    def fetch(self: Any, url: str) -> str:
        attempts.append(self.request.retries)
        if self.request.retries < 2:
            raise ConnectionError("flaky network")
        return url

    with in_process_worker(celery_lock_app):
        assert fetch.delay("u").get(timeout=TIMEOUT) == "u"
    assert attempts == [0, 1, 2]
    assert not task_locks.is_held(fetch, "u")


def test_exhausted_retries_keep_the_release_delay(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, max_retries=0, lock_release_delay=60
    )
    def doomed(self: Any) -> None:
        raise self.retry(countdown=60, exc=RuntimeError("no luck"))

    with in_process_worker(celery_lock_app), pytest.raises(RuntimeError):
        doomed.delay().get(timeout=TIMEOUT)
    fields = lock_fields(doomed)
    assert fields.get("state") == "release_delay", fields
    assert task_locks.is_held(doomed)


# -- item: a redelivered copy of a running task ----------------------------------------------


@pytest.mark.parametrize(
    ("lock_wait", "lock_mode"),
    [(0, "exclusive"), (60, "exclusive"), (0, "write")],
    ids=["skip", "wait", "write"],
)
def test_redelivered_copy_of_a_running_task_is_requeued_and_dropped_once_it_finished(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, lock_wait: float, lock_mode: str
) -> None:
    started, finish = threading.Event(), threading.Event()
    runs: list[tuple[float, float]] = []

    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_wait=lock_wait, lock_lease=3, max_retries=0,
        lock_mode=lock_mode,
    )  # fmt: skip
    def report(day: str) -> str:
        began = time.monotonic()
        started.set()
        assert finish.wait(TIMEOUT)
        runs.append((began, time.monotonic()))
        return f"report for {day}"

    with (
        task_log() as messages,
        postrun_states() as states,
        in_process_worker(celery_lock_app, concurrency=2),
    ):
        original = report.delay("monday")
        assert started.wait(TIMEOUT)
        # What a broker redelivers (visibility timeout, acks_late): the same message again.
        celery_lock_app.send_task(report.name, ("monday",), task_id=original.id)
        wait_until(lambda: bool(states.get(original.id)), "the copy to be re-queued")
        assert states[original.id] == ["IGNORED"]
        assert original.state == "PENDING"  # the copy stored nothing under the original's id
        live = "a live copy of this task id" if lock_mode == "exclusive" else "a hold of this"
        assert any(f"re-queued: {live}" in m for m in messages), messages
        # Not acked into oblivion: it looks again, finds the original still live (its
        # heartbeat renews it), and is re-queued again, without using up a retry.
        wait_until(lambda: len(states[original.id]) >= 2, "the re-queued copy to look again")
        assert not runs and original.state == "PENDING"
        finish.set()
        assert original.get(timeout=TIMEOUT) == "report for monday"
        # Once the original's result is in, the copy is dropped: that result stands.
        wait_until(
            lambda: any("dropped: the original run ended (SUCCESS)" in m for m in messages),
            "the copy to be dropped",
        )
    assert len(runs) == 1
    assert original.get(timeout=TIMEOUT) == "report for monday"


def test_without_a_result_backend_a_requeued_copy_is_dropped_once_its_original_ended(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    celery_lock_app.conf.result_backend = None  # only the done mark says the original ended
    started, finish = threading.Event(), threading.Event()
    runs: list[tuple[float, float]] = []

    @celery_lock_app.task(base=SingletonTask, shared=False, lock_lease=3)
    def report(day: str) -> None:
        began = time.monotonic()
        started.set()
        assert finish.wait(TIMEOUT)
        runs.append((began, time.monotonic()))

    with postrun_states() as states, in_process_worker(celery_lock_app, concurrency=2):
        original = report.delay("monday")
        assert started.wait(TIMEOUT)
        celery_lock_app.send_task(report.name, ("monday",), task_id=original.id)
        wait_until(lambda: bool(states.get(original.id)), "the copy to be re-queued")
        assert states[original.id] == ["IGNORED"]
        finish.set()
        # The copy comes back once the original let go, finds its done mark, and is dropped.
        wait_until(lambda: len(states[original.id]) == 3, "the copy to come back")
        assert states[original.id] == ["IGNORED", "SUCCESS", "IGNORED"]
    assert len(runs) == 1


# -- item: enqueue-time locking inside canvases ----------------------------------------------


def test_deduplicated_chain_member_does_not_drop_the_chain(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    @celery_lock_app.task(shared=False)
    def notify(previous: Any) -> str:
        return "skipped" if is_skipped(previous) else f"synced {previous}"

    queued = sync.apply_async((5,), queue="nobody-consumes-this")
    with in_process_worker(celery_lock_app):
        result = chain(sync.si(5), notify.s()).apply_async()
        # The member ran into the queued call's claim at run time: skipped, chain goes on.
        assert result.get(timeout=TIMEOUT) == "skipped"
        assert chain(sync.si(6), notify.s()).apply_async().get(timeout=TIMEOUT) == "synced 6"
    assert sync.delay(5).id == queued.id  # a plain duplicate is still deduplicated


def test_deduplicated_chord_member_still_completes_the_chord(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    @celery_lock_app.task(shared=False)
    def total(results: list[Any]) -> int:
        return sum(value for value in results if not is_skipped(value))

    sync.apply_async((5,), queue="nobody-consumes-this")
    with in_process_worker(celery_lock_app):
        result = chord([sync.si(5), sync.si(6), sync.si(7)], total.s()).apply_async()
        assert result.get(timeout=TIMEOUT) == 13


def test_group_of_duplicates_returns_every_member(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    with in_process_worker(celery_lock_app):
        values = group(sync.si(5), sync.si(5), sync.si(6)).apply_async().get(timeout=TIMEOUT)
    # The first member claimed the key and ran; its duplicate was sent all the same and ran
    # or was skipped at run time, depending on when it started.
    assert values[0] == 5 and (values[1] == 5 or is_skipped(values[1])) and values[2] == 6


# -- item: claims of messages that will never run --------------------------------------------


def test_revoked_queued_call_frees_its_claim(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    revoked = threading.Event()

    def on_revoked(**_: Any) -> None:
        revoked.set()  # connected after the package's receiver, so it runs after it

    task_revoked.connect(on_revoked, weak=False)
    try:
        with in_process_worker(celery_lock_app):
            task_id = uuid()
            # Until the worker answers: a broadcast sent before it listens is not queued.
            wait_until(
                lambda: bool(
                    celery_lock_app.control.revoke(task_id, reply=True, timeout=1, limit=1)
                ),
                "the worker to acknowledge the revoke",
            )
            queued = sync.apply_async((5,), task_id=task_id)
            assert revoked.wait(TIMEOUT)
            assert not task_locks.is_held(sync, 5)
            fresh = sync.delay(5)
            assert fresh.id != queued.id
            assert fresh.get(timeout=TIMEOUT) == 5
    finally:
        task_revoked.disconnect(on_revoked)


def test_claim_of_a_task_the_backend_says_is_over_is_stale(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    queued = sync.apply_async((5,), queue="nobody-consumes-this")
    # A worker that discarded the message and recorded it without freeing the claim (it
    # could not reach the lock Redis then, or ran an older version of the package).
    celery_lock_app.backend.mark_as_revoked(queued.id, "revoked")
    infos = admin.list_locks(sync.lock_client, checks=[evidence.backend_check(celery_lock_app)])
    assert [(info.task_id, info.state) for info in infos] == [(queued.id, admin.STALE)]
    assert infos[0].evidence == "result backend: REVOKED"
    with in_process_worker(celery_lock_app):
        fresh = sync.delay(5)
        assert fresh.id != queued.id
        assert fresh.get(timeout=TIMEOUT) == 5


def test_claim_of_a_pending_task_is_not_stale(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    queued = sync.apply_async((5,), queue="nobody-consumes-this")
    infos = admin.list_locks(sync.lock_client, checks=[evidence.backend_check(celery_lock_app)])
    assert [(info.task_id, info.state) for info in infos] == [(queued.id, admin.QUEUED)]
    assert sync.delay(5).id == queued.id


# -- item: skip messages name the real holder ------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"lock_mode": "write", "lock_key": "dataset:{customer}"},
        {"lock_range": ("lo", "hi"), "lock_key": "rows:{customer}"},
        {"lock_keys": ["account:{customer}", "ledger"]},
    ],
    ids=["rwlock", "range", "multi"],
)
def test_skip_names_the_holder_of_every_lock_kind(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    options: dict[str, Any],
) -> None:
    started, finish = threading.Event(), threading.Event()

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, **options)
    def job(self: Any, customer: int, lo: int = 0, hi: int = 10) -> int:
        if self.request.id.startswith("holder-"):
            started.set()
            assert finish.wait(TIMEOUT)
        return customer

    holder_id = f"holder-{uuid()}"
    with in_process_worker(celery_lock_app, concurrency=2), task_log() as logged:
        holder = job.apply_async((1,), task_id=holder_id)
        assert started.wait(TIMEOUT)
        skipped = job.delay(1).get(timeout=TIMEOUT)
        finish.set()
        assert holder.get(timeout=TIMEOUT) == 1
    assert is_skipped(skipped)
    assert skipped["holder_task_id"] == holder_id
    assert skipped["reason"] == f"held by task {holder_id}", skipped
    messages = [message for message in logged if "skipped" in message]
    assert len(messages) == 1 and f"held by task {holder_id}" in messages[0], messages
    assert "None" not in messages[0]


def test_skip_in_a_release_delay_says_until_when(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_release_delay=60)
    def job() -> str:
        return "ran"

    with in_process_worker(celery_lock_app), task_log() as logged:
        first = job.delay()
        assert first.get(timeout=TIMEOUT) == "ran"
        skipped = job.delay().get(timeout=TIMEOUT)
    assert is_skipped(skipped)
    assert skipped["holder_task_id"] is None  # the finished run holds nothing
    messages = [message for message in logged if "skipped" in message]
    assert len(messages) == 1, messages
    assert "in a release delay until 20" in messages[0] and first.id not in messages[0], messages
    # The result says it too, for callers that print it (the example project does).
    assert skipped["reason"].startswith("in a release delay until 20"), skipped


# -- "until start": one queued copy beside the running one -----------------------------------


def test_until_start_keeps_one_queued_copy_beside_the_running_one(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    started, finish = threading.Event(), threading.Event()
    ran: list[str] = []
    done: list[str] = []
    inside: list[int] = []  # how many runs were inside the body as each one entered it
    guard = threading.Lock()

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, lock_on_enqueue="until_start", lock_wait=60
    )
    def rebuild(self: Any, index: str) -> str:
        with guard:
            ran.append(self.request.id)
            inside.append(len(ran) - len(done))
        started.set()
        assert finish.wait(TIMEOUT)
        with guard:
            done.append(self.request.id)
        return index

    def queue_claimed() -> bool:
        client = rebuild.lock_client
        name = claims.queue_name(rebuild.lock_name(("products",)))
        return bool(client.redis.exists(client.connection.keys(name).lock))

    # Two threads: one runs, one waits in the worker for the run-time lock; a third call then
    # stays in the queue (prefetched, not started), holding the queue claim.
    with in_process_worker(celery_lock_app, concurrency=2):
        running = rebuild.delay("products")
        assert started.wait(TIMEOUT)
        waiting = rebuild.delay("products")
        assert waiting.id != running.id  # the run freed its queue claim when it started
        wait_until(lambda: not queue_claimed(), "the second call to start")
        queued = rebuild.delay("products")
        assert queued.id not in (running.id, waiting.id)
        assert rebuild.delay("products").id == queued.id  # one queued copy, no more
        finish.set()
        assert [r.get(timeout=TIMEOUT) for r in (running, waiting, queued)] == ["products"] * 3
    # One at a time. The first runs first; after it, the call waiting in the worker and the
    # one that was queued race for the lock (plain waiters are not served in order).
    assert inside == [1, 1, 1], inside
    assert ran[0] == running.id and sorted(ran[1:]) == sorted([waiting.id, queued.id]), ran


def test_debounce_replaces_the_queued_call_with_the_latest(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_on_enqueue="debounce", lock_key="sync:{customer}"
    )
    def sync(customer: int, revision: str) -> str:
        return revision

    first = sync.delay(5, "r1")
    second = sync.delay(5, "r2")
    latest = sync.delay(5, "r3")
    assert len({first.id, second.id, latest.id}) == 3  # every call is sent...
    other = sync.delay(6, "r1")
    with in_process_worker(celery_lock_app, concurrency=1):
        # ...but only the latest queued one runs; the ones it replaced say so.
        assert task_locks.assert_ran(latest) == "r3"
        for replaced in (first, second):
            value = replaced.get(timeout=TIMEOUT)
            assert is_skipped(value) and value["holder_task_id"] == latest.id, value
        assert task_locks.assert_ran(other) == "r1"
    assert sync.delay(5, "r4").id not in (first.id, second.id, latest.id)


def test_debounce_redelivered_copy_of_a_running_task_stores_nothing(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    started, finish = threading.Event(), threading.Event()

    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_on_enqueue="debounce", lock_key="sync:{customer}"
    )
    def sync(customer: int, revision: str) -> str:
        started.set()
        assert finish.wait(TIMEOUT)
        return revision

    with postrun_states() as states, in_process_worker(celery_lock_app, concurrency=2):
        original = sync.delay(5, "r1")
        assert started.wait(TIMEOUT)
        newer = sync.apply_async((5, "r2"), queue="nobody-consumes-this")  # queued meanwhile
        celery_lock_app.send_task(sync.name, (5, "r1"), task_id=original.id)  # redelivered
        wait_until(lambda: bool(states.get(original.id)), "the copy to finish")
        assert states[original.id] == ["IGNORED"]
        assert original.state == "PENDING"
        finish.set()
        assert original.get(timeout=TIMEOUT) == "r1"
    assert newer.id != original.id


def test_until_start_retry_keeps_its_hand_over_and_a_revoke_frees_it(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, lock_on_enqueue="until_start"
    )
    def rebuild(self: Any, index: str) -> str:
        raise self.retry(countdown=1)

    retried, revoked = threading.Event(), threading.Event()

    def on_retry(**_: Any) -> None:
        retried.set()

    def on_revoked(**_: Any) -> None:
        revoked.set()  # connected after the package's receiver, so it runs after it

    task_retry.connect(on_retry, weak=False)
    task_revoked.connect(on_revoked, weak=False)
    try:
        with in_process_worker(celery_lock_app):
            result = rebuild.delay("products")
            assert retried.wait(TIMEOUT)
            assert task_locks.is_held(rebuild, "products")  # handed to the retry message
            wait_until(
                lambda: bool(
                    celery_lock_app.control.revoke(result.id, reply=True, timeout=1, limit=1)
                ),
                "the worker to acknowledge the revoke",
            )
            assert revoked.wait(TIMEOUT)  # when the retry came due
            assert not task_locks.is_held(rebuild, "products")
    finally:
        task_retry.disconnect(on_retry)
        task_revoked.disconnect(on_revoked)
