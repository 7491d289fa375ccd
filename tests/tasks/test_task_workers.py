"""SingletonTask in real ``celery worker`` processes (prefork pool): killed workers and pool
children, revokes, time limits and shutdowns free the lock when they should (and only then),
and duplicates spread over several processes never overlap. Only a holder's own worker
may say its task is not running: a busy worker's lock is not stale because another answered.

The tasks (``worker_app.py``) record what they do in the test Redis; the tests poll those
records and the lock hash with deadlines, never with fixed sleeps. Every worker runs in its
own process group and is SIGKILLed, children and all, when its fixture ends. When a test
fails, the tail of each worker's log is added to its report.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from apps.worker_app import make_app, ticks_key
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.utils.nodenames import host_format
from support.waiting import start_celery_worker, wait_for
from support.workers import WorkerProgram as Worker
from support.workers import WorkerPrograms

from celery_singleton_lock import LockClient, SingletonTask, admin
from celery_singleton_lock.celery.evidence import worker_check
from celery_singleton_lock.celery.testing import TaskLocks
from celery_singleton_lock.core.handle import LockHandle
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.core.keys import lock_keys
from celery_singleton_lock.kinds import rangelock, rwlock, semaphore
from celery_singleton_lock.kinds.intervals import interval_keys

TESTS = Path(__file__).resolve().parent.parent
TIMEOUT = 30.0


# -- workers ------------------------------------------------------------------------------------


class WorkerLogs:
    """A pytest plugin, registered while this module runs: a failed test's report gets the
    tail of the log of every worker it used."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        report = yield
        if report.failed:
            for worker in self.workers:
                tail = "\n".join(worker.log_text().splitlines()[-150:])
                report.sections.append((f"log of worker {worker.name} (pid {worker.pid})", tail))
        return report


class Cluster(WorkerPrograms):
    """Workers of ``worker_app`` on one Redis and lock prefix, and a twin app (same tasks) to
    send their tasks and read what they recorded."""

    def __init__(self, url: str, prefix: str, log_dir: Path, logs: WorkerLogs) -> None:
        super().__init__("apps.worker_app", make_app, url, prefix, log_dir, "default")
        self.logs = logs

    def task(self, name: str) -> Any:
        return self.app.tasks[f"worker_app.{name}"]

    # -- workers --

    def start(self, label: str, *queues: str) -> Worker:
        """Start ``celery worker`` (prefork, two children) consuming ``queues``."""
        worker = self.launch(label, queues)
        self.logs.workers.append(worker)
        return worker

    def stop(self, worker: Worker) -> None:
        worker.kill()
        if worker in self.logs.workers:
            self.logs.workers.remove(worker)

    def close(self) -> None:
        for worker in self.workers:
            self.stop(worker)
        super().close()

    # -- what the tasks recorded, and the locks --

    def lock_key(self, key: str) -> bytes:
        return lock_keys(self.prefix, f"job:{key}").lock

    def is_locked(self, key: str) -> bool:
        return bool(self.redis.exists(self.lock_key(key)))

    def wait_freed(self, key: str, timeout: float = TIMEOUT) -> float:
        """Until the lock of ``key`` is gone; returns the server time it was seen gone."""
        return wait_for(
            lambda: None if self.is_locked(key) else self.server_time(),
            timeout,
            f"the lock of {key!r} to be freed",
        )

    def holds_of(self, task_id: str) -> list[bytes]:
        """The keys of every holder hash of run ``task_id`` (a lease, one name of a multi-key
        lock, a reader-writer or range hold): each records the task id of its holder. Not
        the traces a release or clear leaves (a lease's hash renamed ``P{T}:freed``, an
        interval hold's hash marked released): they hold nothing."""
        found = []
        for key in self.keys():
            if key.endswith(b":freed") or self.redis.type(key) != b"hash":
                continue
            fields = flatten(self.redis.hgetall(key))
            if fields.get(b"task_id") == task_id.encode() and fields.get(b"state") != b"released":
                found.append(key)
        return found

    def server_time(self) -> float:
        seconds, micros = self.redis.time()
        return int(seconds) + int(micros) / 1_000_000

    def keys(self) -> list[bytes]:
        """Every key under the lock prefix."""
        escaped = b"".join(
            b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in self.prefix.encode()
        )
        return list(self.redis.scan_iter(match=escaped + b"*", count=1000))

    def without_expiry(self, keys: list[bytes]) -> list[tuple[bytes, int]]:
        """Those of ``keys`` that would stay forever (PTTL -1) or are gone already (-2): none,
        the prefix's key layout record (core/layout.py) included."""
        return [(key, ttl) for key in keys if (ttl := self.redis.pttl(key)) <= 0]


@dataclass
class Pair:
    """Two workers sharing a queue, each also consuming a queue of its own."""

    w0: Worker
    w1: Worker
    shared: str
    q0: str
    q1: str


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts as exited: it runs no code)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker_logs(request: pytest.FixtureRequest) -> Iterator[WorkerLogs]:
    plugin = WorkerLogs()
    name = f"worker-logs-{uuid.uuid4().hex}"
    request.config.pluginmanager.register(plugin, name)
    yield plugin
    request.config.pluginmanager.unregister(name=name)


@pytest.fixture(scope="module")
def cluster(
    lock_redis_url: str, worker_logs: WorkerLogs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Workers shared by the tests of this module, under one lock prefix."""
    prefix = f"csltest:{uuid.uuid4().hex[:12]}:"
    workers = Cluster(lock_redis_url, prefix, tmp_path_factory.mktemp("workers"), worker_logs)
    yield workers
    workers.close()


@pytest.fixture(scope="module")
def module_pair(cluster: Cluster) -> Pair:
    shared, q0, q1 = cluster.queue("shared"), cluster.queue("q0"), cluster.queue("q1")
    w0 = cluster.start("w0", shared, q0)
    w1 = cluster.start("w1", shared, q1)
    cluster.wait_ready(w0, w1)
    return Pair(w0, w1, shared, q0, q1)


@pytest.fixture
def pair(module_pair: Pair, cluster: Cluster) -> Pair:
    """The module's two workers, checked alive (a test may kill pool children, not them)."""
    for worker in (module_pair.w0, module_pair.w1):
        assert worker.process.poll() is None, f"worker {worker.name} died in an earlier test"
    return module_pair


@pytest.fixture
def extra_workers(cluster: Cluster) -> Iterator[Cluster]:
    """The module's cluster; workers a test starts through it are killed when it ends."""
    before = len(cluster.workers)
    yield cluster
    for worker in cluster.workers[before:]:
        cluster.stop(worker)
    del cluster.workers[before:]


@pytest.fixture
def own_cluster(
    lock_redis_url: str, lock_prefix: str, tmp_path: Path, worker_logs: WorkerLogs
) -> Iterator[Cluster]:
    """Workers of this test alone, under the test's own lock prefix."""
    workers = Cluster(lock_redis_url, lock_prefix, tmp_path, worker_logs)
    yield workers
    workers.close()


# -- crashes ------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_sigkilled_worker_frees_the_lock_within_the_lease_not_the_ttl(
    extra_workers: Cluster, pair: Pair, task_locks: TaskLocks
) -> None:
    cluster = extra_workers
    victim = cluster.start("victim", cluster.queue("victim"))
    cluster.wait_ready(victim)
    key, lease = "worker-killed", 2.0
    first = cluster.task("short_lease").apply_async((key, 600), queue=victim.queues[0])
    started = cluster.wait_record(event="start", task_id=first.id)
    holder = flatten(cluster.redis.hgetall(cluster.lock_key(key)))
    assert int(holder[b"pid"]) == started["pid"] != victim.pid  # a pool child holds it
    # lock_ttl is an hour: a lock without a renewed lease would stay that long.
    assert int(holder[b"deadline_ms"]) - int(holder[b"acquired_ms"]) == 3600 * 1000

    victim.kill()  # the main process and its children: nobody is left to release anything
    killed_at = cluster.server_time()
    remaining = cluster.redis.pttl(cluster.lock_key(key)) / 1000
    assert victim.process.returncode == -signal.SIGKILL
    assert 0 < remaining <= lease

    wait_for(lambda: process_gone(started["pid"]), TIMEOUT, "the pool child to die too")

    # The same call again, on another worker (short_lease waits up to 30 s for its lock).
    second = cluster.task("short_lease").apply_async((key, 0), queue=pair.q1)
    token = task_locks.assert_ran(second, timeout=TIMEOUT)
    run = cluster.wait_record(event="start", task_id=second.id)
    # It ran once the dead holder's lease ran out, not before, and not an hour later.
    assert remaining - 0.2 <= run["time"] - killed_at < lease + 5
    assert token > started["token"]
    assert run["worker"] == pair.w1.name
    assert not cluster.records(event="released", task_id=first.id)


@pytest.mark.timeout(120)
def test_sigkilled_pool_child_is_freed_at_once_by_the_main_process(
    cluster: Cluster, pair: Pair, task_locks: TaskLocks
) -> None:
    key = "child-killed"
    first = cluster.task("long_lease").apply_async((key, 600), queue=pair.q0)  # lock_lease=60
    started = cluster.wait_record(event="start", task_id=first.id)
    child = started["pid"]
    assert child != pair.w0.pid
    os.kill(child, signal.SIGKILL)
    killed_at = cluster.server_time()
    # The main process sees WorkerLostError and frees the lock (SingletonRequest.on_failure).
    freed_at = cluster.wait_freed(key)
    assert freed_at - killed_at < 10  # the lease would have kept it for up to 60 s
    wait_for(lambda: first.state == "FAILURE", TIMEOUT, "the killed run to be marked failed")
    assert "WorkerLostError" in repr(first.result)
    # The main process logs this just after the free that wait_freed saw: await the line.
    wait_for(
        lambda: f"freed lock 'job:{key}'" in pair.w0.log_text(), TIMEOUT, "the freed-lock log line"
    )
    assert not cluster.records(event="released", task_id=first.id)  # not by the child

    second = cluster.task("long_lease").apply_async((key, 0), queue=pair.q1)
    assert task_locks.assert_ran(second, timeout=TIMEOUT) > started["token"]
    run = cluster.wait_record(event="start", task_id=second.id)
    assert run["time"] - killed_at < 15
    cluster.wait_ready(pair.w0)  # the worker itself lives on, with a new child


@pytest.mark.timeout(120)
def test_a_worker_restarted_under_its_node_name_frees_its_previous_lifes_locks_at_start(
    extra_workers: Cluster, pair: Pair, task_locks: TaskLocks
) -> None:
    cluster = extra_workers
    queue = cluster.queue("reborn")
    first_life = cluster.start("reborn", queue)
    cluster.wait_ready(first_life)
    key = "reborn"
    # A call of its first life under a task id a listing once took for a lock key: its done
    # mark (two hours) must not stop the second life's clean-up from listing the locks.
    hostile = f"{uuid.uuid4().hex}-x}}:lock"
    cluster.task("short_lease").apply_async(("hostile", 0), queue=queue, task_id=hostile)
    cluster.wait_record(event="end", task_id=hostile)
    cluster.wait_freed("hostile")
    first = cluster.task("long_lease").apply_async((key, 600), queue=queue)  # lock_lease=60
    started = cluster.wait_record(event="start", task_id=first.id)
    first_life.kill()  # systemd's SIGKILL: the main process and its children
    killed_at = cluster.server_time()
    wait_for(lambda: process_gone(started["pid"]), TIMEOUT, "the pool child to die too")
    assert cluster.redis.pttl(cluster.lock_key(key)) > 40_000  # the lease would hold it

    second_life = cluster.start("reborn", queue)  # the same node name, as systemd restarts it
    assert second_life.name == first_life.name
    cluster.wait_ready(second_life)
    # Freed as the worker started (before it answered a ping), not after the 60 s lease.
    assert not cluster.is_locked(key)
    assert cluster.server_time() - killed_at < 40
    assert f"'job:{key}' held by worker_app.long_lease[{first.id}]" in second_life.log_text()
    assert "left by a previous life of worker" in second_life.log_text()
    again = cluster.task("long_lease").apply_async((key, 0), queue=pair.q1)
    assert task_locks.assert_ran(again, timeout=TIMEOUT) > started["token"]


@dataclass(frozen=True)
class LockKind:
    """A task of a lock kind other than the exclusive lease (``lock_lease=60``), a call of it
    that holds its lock for a long while, and a call of a task that this hold excludes."""

    task: str
    args: tuple[Any, ...]
    rival: str
    rival_args: tuple[Any, ...]
    #: The name the worker's log gives the lock.
    lock_name: str
    #: Under a lock prefix: what the keys of the call's holder hashes start with (one per
    #: hash; an interval hold's key ends with its owner token).
    hold_keys: Callable[[str], list[bytes]]


def interval_hold(family: bytes, name: str) -> Callable[[str], list[bytes]]:
    return lambda prefix: [interval_keys(prefix, name, family).base + b"h:"]


def lease_holds(*names: str) -> Callable[[str], list[bytes]]:
    return lambda prefix: sorted(lock_keys(prefix, name).lock for name in names)


LOCK_KINDS = {
    "read": LockKind(
        "long_read", ("killed-read", 600), "long_write", ("killed-read", 0),
        "job:killed-read", interval_hold(rwlock.FAMILY, "job:killed-read"),
    ),
    "range": LockKind(
        "long_range", ("killed-range", 0, 10, 600), "long_range", ("killed-range", 5, 15, 0),
        "job:killed-range", interval_hold(rangelock.FAMILY, "job:killed-range"),
    ),
    "multi": LockKind(
        "long_multi", ("killed-a", "killed-b", 600), "long_multi", ("killed-b", "killed-c", 0),
        "job:killed-a + job:killed-b", lease_holds("job:killed-a", "job:killed-b"),
    ),
    "semaphore": LockKind(
        "long_permit", ("killed-permit", 600), "long_permit", ("killed-permit", 0),
        "job:killed-permit", interval_hold(semaphore.FAMILY, "job:killed-permit"),
    ),
}  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", list(LOCK_KINDS))
def test_sigkilled_pool_child_frees_every_lock_kind_at_once(
    cluster: Cluster, pair: Pair, task_locks: TaskLocks, kind: str
) -> None:
    """As for the exclusive lease above: the main process frees a reader-writer, range,
    multi-key or semaphore hold of a killed child by task id and pid, long before its 60 s
    lease ends."""
    case = LOCK_KINDS[kind]
    task = cluster.task(case.task)
    first = task.apply_async(case.args, queue=pair.q0)
    started = cluster.wait_record(event="start", task_id=first.id)
    child = started["pid"]
    assert child != pair.w0.pid
    holds = cluster.holds_of(first.id)
    expected = case.hold_keys(cluster.prefix)
    assert len(holds) == len(expected), holds
    pairs = zip(sorted(holds), expected, strict=True)
    assert all(key.startswith(start) for key, start in pairs), (holds, expected)
    assert {int(flatten(cluster.redis.hgetall(key)).get(b"pid") or 0) for key in holds} == {child}
    assert all(60_000 - 5_000 < cluster.redis.pttl(key) <= 60_000 for key in holds)
    assert task_locks.is_held(cluster.task(case.rival), *case.rival_args)

    os.kill(child, signal.SIGKILL)
    killed_at = cluster.server_time()
    freed_at = wait_for(
        lambda: None if cluster.holds_of(first.id) else cluster.server_time(),
        15,  # the lease would keep them for up to 60 s
        f"the {kind} holds of the killed run to be freed",
    )
    assert freed_at - killed_at < 10
    assert not task_locks.is_held(cluster.task(case.rival), *case.rival_args)
    wait_for(lambda: first.state == "FAILURE", TIMEOUT, "the killed run to be marked failed")
    assert "WorkerLostError" in repr(first.result)
    wait_for(
        lambda: f"freed lock {case.lock_name!r}" in pair.w0.log_text(),
        TIMEOUT,
        "the freed-lock log line",
    )
    assert not cluster.records(event="released", task_id=first.id)  # not by the child

    # A run its hold excluded gets in now (lock_wait=0: it would be skipped, not wait).
    second = cluster.task(case.rival).apply_async(case.rival_args, queue=pair.q1)
    assert task_locks.assert_ran(second, timeout=TIMEOUT) > started["token"]
    run = cluster.wait_record(event="start", task_id=second.id)
    assert run["time"] - killed_at < 15
    cluster.wait_ready(pair.w0)  # the worker itself lives on, with a new child


@pytest.mark.parametrize("family", [rwlock.FAMILY, rangelock.FAMILY], ids=["rw", "range"])
def test_interval_release_holder_frees_only_the_hold_of_that_task_and_process(
    lock_client: LockClient, family: bytes
) -> None:
    """What the main process calls for a reader-writer or range hold: only the hold whose
    task id and pid both match goes (after the delay asked for); another task's stays."""

    def reader(task_id: str) -> LockHandle:
        options = {"ttl": 60.0, "heartbeat": False, "owner_info": {"task_id": task_id}}
        if family == rwlock.FAMILY:
            return lock_client.rwlock("doc").read(**options)
        return lock_client.range_lock("doc").read(0, 10, **options)

    admin = rwlock.ADMIN if family == rwlock.FAMILY else rangelock.ADMIN

    def holders() -> dict[str, dict[str, Any]]:
        found = admin.list_holders(lock_client, "doc")
        return {holder["task_id"]: holder for holder in found}

    def release(task_id: str, pid: int, delay: float = 0.0) -> bool:
        return admin.release_holder(lock_client, "doc", task_id=task_id, pid=pid, delay=delay)

    mine, other = reader("mine"), reader("other")
    assert mine.acquire(0) and other.acquire(0)
    pid = os.getpid()
    assert not release("nobody", pid)
    assert not release("mine", pid + 1)  # the same task id in another process
    assert sorted(holders()) == ["mine", "other"]
    assert all("state" not in holder for holder in holders().values())

    assert release("mine", pid, delay=30)
    held = holders()
    # Release delay: its interval stays locked, unrenewed, for the 30 s asked for.
    assert held["mine"]["state"] == "release_delay"
    assert 25_000 < held["mine"]["pttl_ms"] <= 30_000
    assert held["other"]["token"] == other.token and "state" not in held["other"]
    assert not release("mine", pid)  # released already: its delay does not start over

    assert release("other", pid)
    assert sorted(holders()) == ["mine"]
    assert not release("other", pid)


# -- no overlap, retries ------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_duplicates_over_two_workers_run_one_at_a_time(
    cluster: Cluster, pair: Pair, task_locks: TaskLocks
) -> None:
    key, count = "no-overlap", 12
    waiter = cluster.task("waiter")  # lock_wait=60: every duplicate runs in the end
    results = [waiter.apply_async((key, 0.15), queue=pair.shared) for _ in range(count)]
    tokens = [task_locks.assert_ran(result, timeout=TIMEOUT) for result in results]

    starts = cluster.records(event="start", key=key)
    ends = {entry["task_id"]: entry for entry in cluster.records(event="end", key=key)}
    assert sorted(entry["task_id"] for entry in starts) == sorted(r.id for r in results)
    assert len(ends) == count  # each ran exactly once, start to end
    runs = sorted((e["time"], ends[e["task_id"]]["time"], e["token"]) for e in starts)
    for start, end, _ in runs:
        assert start <= end
    for (_, end, token), (next_start, _, next_token) in zip(runs, runs[1:], strict=False):
        assert end <= next_start, runs  # no two runs of the key overlapped
        assert token < next_token, runs  # fencing tokens increase in run order
    assert sorted(tokens) == [token for _, _, token in runs]
    assert {entry["worker"] for entry in starts} == {pair.w0.name, pair.w1.name}
    assert len({entry["pid"] for entry in starts}) >= 3  # pool children of both workers
    assert not cluster.is_locked(key)


@pytest.mark.timeout(120)
def test_retry_on_another_worker_keeps_the_lock_through_its_countdown(
    cluster: Cluster, pair: Pair, task_locks: TaskLocks
) -> None:
    key = "retry"
    flaky = cluster.task("flaky")  # retries once, countdown=1, on the queue it is given
    first = flaky.apply_async((key, pair.q1), queue=pair.q0)
    retrying = cluster.wait_record(event="retry", task_id=first.id)
    duplicate = flaky.apply_async((key, pair.q1), queue=pair.q0)
    task_locks.assert_skipped(duplicate, timeout=TIMEOUT)
    assert duplicate.get(timeout=TIMEOUT)["holder_task_id"] == first.id
    assert first.get(timeout=TIMEOUT) == 1  # the retried run was not skipped

    attempts = {e["retries"]: e for e in cluster.records(event="start", task_id=first.id)}
    assert sorted(attempts) == [0, 1]
    assert attempts[0]["worker"] == pair.w0.name
    assert attempts[1]["worker"] == pair.w1.name
    skipped = cluster.wait_record(event="skipped", task_id=duplicate.id)
    # The duplicate came during the countdown, when no run of the key was running.
    assert retrying["time"] < skipped["time"] < attempts[1]["time"]
    assert attempts[1]["token"] > attempts[0]["token"]
    assert not cluster.records(event="start", task_id=duplicate.id)
    assert not cluster.is_locked(key)


# -- revoke, time limits ------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signame", ["SIGKILL", "SIGTERM"])
def test_revoke_with_terminate_frees_the_lock(
    cluster: Cluster, pair: Pair, task_locks: TaskLocks, signame: str
) -> None:
    key = f"revoked-{signame}"
    first = cluster.task("long_lease").apply_async((key, 600), queue=pair.q0)  # lock_lease=60
    started = cluster.wait_record(event="start", task_id=first.id)
    cluster.app.control.revoke(first.id, terminate=True, signal=signame)
    revoked_at = cluster.server_time()
    freed_at = cluster.wait_freed(key)
    assert freed_at - revoked_at < 10
    wait_for(lambda: process_gone(started["pid"]), TIMEOUT, "the revoked run's process to end")
    released_by_child = cluster.records(event="released", task_id=first.id)
    if signame == "SIGKILL":
        # Nothing ran in the child: the main process freed the lock.
        assert not released_by_child
        wait_for(
            lambda: f"freed lock 'job:{key}'" in pair.w0.log_text(),
            TIMEOUT,
            "the freed-lock log line",
        )
    else:
        # SIGTERM exits the child through its finally blocks: the run released it itself.
        assert [entry["pid"] for entry in released_by_child] == [started["pid"]]
    assert not cluster.records(event="end", task_id=first.id)

    second = cluster.task("long_lease").apply_async((key, 0), queue=pair.q1)
    assert task_locks.assert_ran(second, timeout=TIMEOUT) > started["token"]


@pytest.mark.timeout(120)
def test_soft_time_limit_releases_in_the_task(
    cluster: Cluster, pair: Pair, task_locks: TaskLocks
) -> None:
    key = "soft-limit"
    first = cluster.task("long_lease").apply_async((key, 600), queue=pair.q0, soft_time_limit=1)
    started = cluster.wait_record(event="start", task_id=first.id)
    freed_at = cluster.wait_freed(key)
    assert freed_at - started["time"] < 1 + 10  # the lease is 60 s
    wait_for(lambda: first.state == "FAILURE", TIMEOUT, "the run to fail")
    assert "SoftTimeLimitExceeded" in repr(first.result)
    # The body caught nothing: SingletonTask's own finally released the lock, in the child.
    released = cluster.records(event="released", task_id=first.id)
    assert [entry["pid"] for entry in released] == [started["pid"]]
    assert f"freed lock 'job:{key}'" not in pair.w0.log_text()

    second = cluster.task("long_lease").apply_async((key, 0), queue=pair.q1)
    assert task_locks.assert_ran(second, timeout=TIMEOUT) > started["token"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["dies-on-sigterm", "needs-sigkill"])
def test_hard_time_limit_frees_the_lock_only_once_the_child_is_gone(
    cluster: Cluster, pair: Pair, task_locks: TaskLocks, ignore_sigterm: bool
) -> None:
    """The pool ends a run past its hard limit with SIGTERM, then SIGKILL 0.1 s later. The
    ticker counts in Redis until its process is gone; the waiter notes the count when it gets
    the lock. Any tick after that would be the two runs overlapping."""
    key = f"hard-limit-{ignore_sigterm}"
    ticker = cluster.task("ticker")  # lock_lease=60
    first = ticker.apply_async((key, 600, ignore_sigterm), queue=pair.q0, time_limit=1)
    started = cluster.wait_record(event="start", task_id=first.id)
    waiting = cluster.task("waiter").apply_async((key, 0), queue=pair.q1)  # lock_wait=60
    token = task_locks.assert_ran(waiting, timeout=TIMEOUT)
    run = cluster.wait_record(event="start", task_id=waiting.id)
    assert run["time"] - started["time"] < 1 + 10  # the lease is 60 s
    assert token > started["token"]
    wait_for(lambda: process_gone(started["pid"]), TIMEOUT, "the ticker's process to end")
    ticks = int(cluster.redis.get(ticks_key(cluster.prefix, key)) or 0)
    assert ticks > 100  # it did tick...
    assert ticks == run["ticks"], "the ticker ran on after the waiter took the lock"
    wait_for(lambda: first.state == "FAILURE", TIMEOUT, "the run to fail")
    assert "TimeLimitExceeded" in repr(first.result)
    if ignore_sigterm:
        # The main process freed it.
        wait_for(
            lambda: f"freed lock 'job:{key}'" in pair.w0.log_text(),
            TIMEOUT,
            "the freed-lock log line",
        )


# -- shutdown -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_warm_shutdown_finishes_the_run_and_leaves_no_lock(
    own_cluster: Cluster, cluster: Cluster, task_locks: TaskLocks
) -> None:
    worker = own_cluster.start("warm", own_cluster.queue("warm"))
    own_cluster.wait_ready(worker)
    key = "warm-shutdown"
    first = own_cluster.task("long_lease").apply_async((key, 2), queue=worker.queues[0])
    started = own_cluster.wait_record(event="start", task_id=first.id)
    os.kill(worker.pid, signal.SIGTERM)  # warm shutdown: the running task may finish
    assert worker.process.wait(TIMEOUT) == 0
    assert not own_cluster.is_locked(key)  # released when the run ended, before the exit
    assert own_cluster.records(event="end", task_id=first.id)
    released = own_cluster.records(event="released", task_id=first.id)
    assert [entry["pid"] for entry in released] == [started["pid"]]
    assert task_locks.assert_ran(first, timeout=TIMEOUT) == started["token"]
    # Nothing this package (or these tests) wrote stays in Redis forever; the module's
    # shared cluster is checked too, whatever ran on it before.
    keys = own_cluster.keys()
    assert any(key.endswith(b"}:fence") for key in keys), keys
    assert own_cluster.without_expiry(keys) == []
    assert cluster.without_expiry(cluster.keys()) == []


def test_worker_check_trusts_only_the_holders_own_worker(
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
    celery_lock_app: Celery,
    tmp_path: Path,
) -> None:
    app = celery_lock_app
    tag = uuid.uuid4().hex[:8]
    busy_node = f"csltest-busy-{tag}@{socket.gethostname()}"
    idle_node = host_format(f"csltest-idle-{tag}@%h")
    started, finish = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, bind=True, name="csltest.busy", lock_ttl=30)
    def busy(self: Any) -> None:
        started.set()
        finish.wait(30)

    # An idle worker on this host (its own process, consuming another queue), answering.
    idle = start_celery_worker(
        "apps.worker_app",
        queues=[f"{lock_prefix}idle"],
        name=idle_node,
        env={
            **os.environ,
            "CSL_WORKER_REDIS_URL": lock_redis_url,
            "CSL_WORKER_PREFIX": lock_prefix,
            "CSL_WORKER_QUEUE": f"{lock_prefix}idle",
        },
        log=tmp_path / "idle.log",
        concurrency=1,
    )
    try:
        wait_for(
            lambda: app.control.ping(destination=[idle_node], timeout=0.5),
            60,
            "the idle worker to answer",
        )
        # A solo worker runs tasks on the thread that answers the control commands: while
        # it runs the task holding the lock it answers nobody.
        with start_worker(
            app,
            pool="solo",
            hostname=busy_node,
            perform_ping_check=False,
            shutdown_timeout=20,
            loglevel="WARNING",
        ):
            try:
                busy.delay()
                assert started.wait(30)
                # Holders without a heartbeat, on the busy node and on the idle one.
                quiet = lock_client.lease(
                    "quiet-busy",
                    ttl=30,
                    heartbeat=False,
                    owner_info={"task_id": "t-busy", "worker": busy_node},
                )
                gone = lock_client.lease(
                    "quiet-idle",
                    ttl=30,
                    heartbeat=False,
                    owner_info={"task_id": "t-idle", "worker": idle_node},
                )
                assert quiet.acquire() and gone.acquire()
                check = worker_check(app, timeout=2.0)
                infos = {i.name: i for i in admin.list_locks(lock_client, checks=[check])}
            finally:
                finish.set()
    finally:
        idle.kill()
        idle.wait()
    (held,) = [i for i in infos.values() if i.task_name == "csltest.busy"]
    assert (held.state, held.evidence) == ("live", "heartbeat fresh")
    assert held.worker == busy_node
    assert (infos["quiet-busy"].state, infos["quiet-busy"].evidence) == ("live", "no evidence")
    assert (infos["quiet-idle"].state, infos["quiet-idle"].evidence) == (
        "stale",
        f"not active on its worker {idle_node}",
    )
    quiet.release()
    gone.release()
