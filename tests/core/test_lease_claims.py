"""The lease's public claim API: hold under a fixed owner token (``owner``), take over a
claim (``take_over``), pass a held lease to a claim (``hand_over``), release a claim no
handle holds (``LockClient.release_owner``), read who holds a name (``holders``), and free
the holds of a run whose process ended (``release_holder``, the supervisor's call: on this
machine only, and never the claim of the run's next attempt).

The Celery layer's claims (enqueue-time locks, retries) are built on exactly these; these
tests pin the contract, its interleavings with another owner, and its argument checks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import (
    ConfigurationError,
    HolderRecord,
    LockClient,
    LockError,
    LockLost,
    LockNotHeld,
    ReleaseResult,
    SingletonTask,
)
from celery_singleton_lock.celery.claims import claim_owner
from celery_singleton_lock.core.handle import LockHandle
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.core.holder import HOSTNAME
from celery_singleton_lock.core.pid_evidence import ProcessMark, this_process
from celery_singleton_lock.embedded import free_port
from celery_singleton_lock.kinds import multi, rangelock, rwlock, semaphore
from celery_singleton_lock.kinds.intervals import IntervalHandle
from celery_singleton_lock.kinds.lease import Lease
from celery_singleton_lock.kinds.multi import MultiLease
from celery_singleton_lock.kinds.rwlock import RWLockHandle


@pytest.fixture
def dead_client() -> Iterator[LockClient]:
    """A client of a port where nothing listens: a ConfigurationError from it proves the
    argument was checked before any round trip (a Redis call would raise LockBackendError)."""
    client = LockClient.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix="dead:")
    yield client
    client.close()


def test_a_fixed_owner_is_the_owner_its_holder_record_names(lock_client: LockClient) -> None:
    lease = lock_client.lease("job", owner="claim:t1:0", owner_info={"task_id": "t1"})
    assert lease.owner is None  # not held yet
    assert lease.acquire()
    assert lease.owner == "claim:t1:0"
    assert lease.holders() == [HolderRecord(owner="claim:t1:0", task_id="t1")]
    assert lock_client.holders("job") == lease.holders()
    lease.release()
    assert lease.owner is None
    assert lock_client.holders("job") == []


def test_a_fresh_owner_per_acquisition_when_none_is_given(lock_client: LockClient) -> None:
    lease = lock_client.lease("job")
    assert lease.acquire()
    first = lease.owner
    lease.release()
    assert lease.acquire()
    assert first and lease.owner and lease.owner != first
    lease.release()


def test_take_over_acquires_the_claim_made_for_it_and_only_that(lock_client: LockClient) -> None:
    claim = lock_client.lease("job", owner="claim:t1:0", heartbeat=False)
    assert claim.acquire()
    assert not lock_client.lease("job").acquire()  # a stranger finds it taken
    assert not lock_client.lease("job", take_over="claim:t2:0").acquire()  # another claim's
    run = lock_client.lease("job", take_over="claim:t1:0")
    assert run.acquire()
    assert run.owner != "claim:t1:0"  # the run holds it under its own token now
    assert [holder.owner for holder in lock_client.holders("job")] == [run.owner]
    run.release()


@pytest.mark.parametrize("first", ["renewal", "release"])
def test_the_claim_kept_for_a_take_overs_undo_goes_with_the_first_renewal_or_release(
    lock_client: LockClient, first: str
) -> None:
    """The take-over keeps the claim aside (``P{T}:undo:<token>``) for as long as the claim
    had left, so that its acquire's undo can put it back if the reply is lost. Once the
    holder renews or releases, that reply came: the kept claim is deleted then, not left for
    the claim's minutes."""
    claim = lock_client.lease("job", owner="claim:t1:0", ttl=300, heartbeat=False)
    assert claim.acquire()
    run = lock_client.lease("job", take_over="claim:t1:0", heartbeat=False)
    assert run.acquire()
    kept = run.keys.base + b"undo:" + str(run.token).encode()
    assert 200_000 < lock_client.redis.pttl(kept) <= 300_000
    if first == "renewal":
        assert run.extend() > 0
        assert not lock_client.redis.exists(kept)
        assert run.held
    run.release()
    assert not lock_client.redis.exists(kept)
    assert lock_client.holders("job") == []


def test_take_over_is_settable_until_the_lease_is_held(lock_client: LockClient) -> None:
    assert lock_client.lease("job", owner="claim:t1:0", heartbeat=False).acquire()
    run = lock_client.lease("job")
    assert run.take_over is None
    run.take_over = "claim:t1:0"
    assert run.take_over == "claim:t1:0"
    assert run.acquire()
    with pytest.raises(LockError, match="held"):
        run.take_over = "claim:t9:0"
    assert run.take_over == "claim:t1:0"
    run.release()


def test_hand_over_passes_the_name_without_a_gap(lock_client: LockClient) -> None:
    lease = lock_client.lease("job", owner_info={"task_id": "t1"})
    assert lease.acquire()
    token = lease.token
    lease.hand_over("claim:t1:1", ttl=60, owner_info={"task_id": "t1", "state": "retry"})
    assert not lease.held and lease.owner is None
    assert lock_client.holders("job") == [HolderRecord(owner="claim:t1:1", task_id="t1")]
    assert not lock_client.lease("job").acquire()  # nobody slips in between
    retried = lock_client.lease("job", take_over="claim:t1:1")
    assert retried.acquire()
    assert retried.token is not None and token is not None and retried.token > token
    retried.release()


def test_hand_over_of_a_lease_taken_meanwhile_raises_lost(lock_client: LockClient) -> None:
    lease = lock_client.lease("job", heartbeat=False)
    assert lease.acquire()
    assert lock_client.clear("job", force=True)
    thief = lock_client.lease("job")
    assert thief.acquire()
    with pytest.raises(LockLost):
        lease.hand_over("claim:t1:1", ttl=60)
    assert [holder.owner for holder in lock_client.holders("job")] == [thief.owner]
    thief.release()


def test_hand_over_of_a_lease_not_held_raises_not_held(lock_client: LockClient) -> None:
    with pytest.raises(LockNotHeld):
        lock_client.lease("job").hand_over("claim:t1:1", ttl=60)


def test_release_owner_says_what_it_did(lock_client: LockClient) -> None:
    assert lock_client.release_owner("job", "claim:t1:0") is ReleaseResult.NOT_HELD
    other = lock_client.lease("job")
    assert other.acquire()
    assert lock_client.release_owner("job", "claim:t1:0") is ReleaseResult.HELD_BY_ANOTHER
    assert other.held
    other.release()
    assert lock_client.lease("job", owner="claim:t1:0", heartbeat=False).acquire()
    assert lock_client.release_owner("job", "claim:t1:0") is ReleaseResult.RELEASED
    assert lock_client.holders("job") == []


def test_release_owner_with_a_delay_leaves_a_release_delay(lock_client: LockClient) -> None:
    assert lock_client.lease("job", owner="claim:t1:0", heartbeat=False).acquire()
    before = lock_client.server_ms()
    assert lock_client.release_owner("job", "claim:t1:0", delay=60) is ReleaseResult.RELEASED
    (delayed,) = lock_client.holders("job")
    assert delayed.owner is None
    assert delayed.release_delay_until_ms is not None
    assert before + 59_000 <= delayed.release_delay_until_ms <= lock_client.server_ms() + 60_000
    assert not lock_client.lease("job").acquire()


def test_every_kind_says_who_holds_it(lock_client: LockClient) -> None:
    multi = lock_client.multi(["a", "b"], owner_info={"task_id": "m"})
    assert multi.acquire()
    found = multi.holders()
    assert len(found) == 1  # both names, one holder
    assert found[0].task_id == "m" and found[0].owner == multi.owner
    multi.release()
    assert multi.holders() == []

    rw = lock_client.rwlock("doc")
    reader = rw.read(owner_info={"task_id": "r1"})
    assert reader.acquire()
    writer = rw.write()
    assert not writer.acquire(0.05)  # it queued a reservation while it waited, then left
    assert [(h.owner, h.task_id) for h in reader.holders()] == [(reader.owner, "r1")]
    reader.release()
    assert reader.holders() == []


def test_release_holder_is_public_on_every_handle(lock_client: LockClient) -> None:
    lease = lock_client.lease("job", owner_info={"task_id": "t1"})
    assert lease.acquire()
    other = lock_client.lease("job")
    assert not other.release_holder(task_id="t2", pid=os.getpid())
    assert other.release_holder(task_id="t1", pid=os.getpid())
    assert lock_client.holders("job") == []


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda c: c.lease("job", owner=""), "owner"),
        (lambda c: c.lease("job", owner=7), "owner"),
        (lambda c: c.lease("job", take_over=b"claim"), "take_over"),
        (lambda c: c.release_owner("job", ""), "owner"),
        (lambda c: c.release_owner("job", "claim:t1:0", delay=-1), "delay"),
        (lambda c: c.release_owner("", "claim:t1:0"), "name"),
        (lambda c: c.holders(""), "name"),
    ],
)
def test_bad_arguments_are_refused_before_any_round_trip(
    dead_client: LockClient, call: object, argument: str
) -> None:
    with pytest.raises(ConfigurationError, match=argument):
        call(dead_client)  # type: ignore[operator]


def test_a_bad_hand_over_loses_nothing(lock_client: LockClient) -> None:
    lease = lock_client.lease("job")
    assert lease.acquire()
    for bad in ({"owner": "", "ttl": 60}, {"owner": "claim:t1:1", "ttl": 0}):
        with pytest.raises(ConfigurationError):
            lease.hand_over(**bad)  # type: ignore[arg-type]
        assert lease.held  # still held, still renewed
    with pytest.raises(ConfigurationError, match="owner_info"):
        lease.hand_over("claim:t1:1", ttl=60, owner_info={"task_id": None})  # type: ignore[dict-item]
    assert lease.held
    lease.release()


def test_owner_info_cannot_overwrite_the_fields_the_scripts_rely_on(
    lock_client: LockClient,
) -> None:
    lease = lock_client.lease("job")
    assert lease.acquire()
    lease.hand_over("claim:t1:1", ttl=60, owner_info={"owner": "forged", "token": "1"})
    assert [holder.owner for holder in lock_client.holders("job")] == ["claim:t1:1"]
    assert lock_client.release_owner("job", "claim:t1:1") is ReleaseResult.RELEASED


KINDS = ["lease", "read", "write", "range", "multi", "semaphore"]


def held_by_task(client: LockClient, kind: str, task_id: str) -> LockHandle:
    """A held lock of ``kind`` whose holder record names run ``task_id`` of this process."""
    options: dict[str, Any] = {"ttl": 60.0, "owner_info": {"task_id": task_id}}
    handle: LockHandle
    if kind == "lease":
        handle = client.lease("job", **options)
    elif kind in ("read", "write"):
        handle = getattr(client.rwlock("job"), kind)(**options)
    elif kind == "range":
        handle = client.range_lock("job").write(0, 10, **options)
    elif kind == "semaphore":
        handle = client.semaphore("job", 2).permit(**options)
    else:
        handle = client.multi(["job", "job-2"], **options)
    assert handle.acquire()
    return handle


def release_holder(client: LockClient, kind: str, **match: Any) -> bool:
    """The supervisor's call for ``kind``: the public function of its module."""
    if kind == "lease":
        return client.release_holder("job", **match)
    if kind in ("read", "write"):
        return rwlock.release_holder(client, "job", **match)
    if kind == "range":
        return rangelock.release_holder(client, "job", **match)
    if kind == "semaphore":
        return semaphore.release_holder(client, "job", **match)
    return multi.release_holder(client, ["job", "job-2"], **match)


def holder_hashes(handle: LockHandle) -> list[bytes]:
    """The Redis hashes holding ``handle``'s holder record (host, pid, task_id...)."""
    if isinstance(handle, MultiLease):
        return [keys.lock for keys in handle.keys]
    if isinstance(handle, (IntervalHandle, RWLockHandle)):
        assert handle.owner is not None
        return [handle.keys.holder(handle.owner)]
    assert isinstance(handle, Lease)
    return [handle.keys.lock]


@pytest.mark.parametrize("kind", KINDS)
def test_release_holder_matches_the_host_too(lock_client: LockClient, kind: str) -> None:
    """A hold recorded on another machine by a process with the same pid (pids are reused
    across hosts and containers) is not freed by this machine's supervisor."""
    handle = held_by_task(lock_client, kind, "t-1")
    pid = os.getpid()
    for key in holder_hashes(handle):
        lock_client.redis.hset(key, "host", "another-machine")

    assert not release_holder(lock_client, kind, task_id="t-1", pid=pid)
    assert not release_holder(lock_client, kind, task_id="t-1", pid=pid, host=HOSTNAME)
    handle.check()  # still held, and renewed
    heartbeat().tick()
    assert handle.held

    assert release_holder(lock_client, kind, task_id="t-1", pid=pid, host="another-machine")
    heartbeat().tick()
    assert handle.lost


@pytest.mark.parametrize("kind", KINDS)
def test_release_holder_matches_the_process_mark_too(lock_client: LockClient, kind: str) -> None:
    """A hold recorded on this host name by a process with the same task id and pid but
    marked as a process of another pid namespace (a container with host networking: pids
    are reused there) is not freed by this machine's supervisor, whose children share its
    namespaces; marked as this process, it is."""
    here = this_process()
    if here is None:
        pytest.skip("no process mark here (not Linux)")
    handle = held_by_task(lock_client, kind, "t-proc")
    pid = os.getpid()
    other = ProcessMark(here.boot, here.pid_ns + 1, here.time_ns, here.start)
    for key in holder_hashes(handle):
        lock_client.redis.hset(key, "proc", other.text())

    assert not release_holder(lock_client, kind, task_id="t-proc", pid=pid)
    assert not release_holder(lock_client, kind, task_id="t-proc", pid=pid, host=HOSTNAME)
    handle.check()  # still held, and renewed
    heartbeat().tick()
    assert handle.held

    for key in holder_hashes(handle):
        lock_client.redis.hset(key, "proc", here.text())
    assert release_holder(lock_client, kind, task_id="t-proc", pid=pid)
    heartbeat().tick()
    assert handle.lost


@pytest.mark.parametrize("kind", KINDS)
def test_release_holder_defaults_to_this_machine(lock_client: LockClient, kind: str) -> None:
    handle = held_by_task(lock_client, kind, "t-2")
    assert not release_holder(lock_client, kind, task_id="t-2", pid=os.getpid(), host="elsewhere")
    assert not release_holder(lock_client, kind, task_id="t-3", pid=os.getpid())
    assert release_holder(lock_client, kind, task_id="t-2", pid=os.getpid())
    heartbeat().tick()
    assert handle.lost


@pytest.mark.parametrize("mode", ["exclusive", "read", "range", "keys", "limit"])
def test_a_tasks_release_holder_passes_the_host_through(celery_lock_app: Celery, mode: str) -> None:
    """``SingletonTask.release_holder`` (what the worker's main process calls) takes the
    host as a keyword and hands it to the lock kind the task uses."""
    options: dict[str, Any] = {"lock_key": "doc-{n}"}
    if mode == "read":
        options["lock_mode"] = "read"
    elif mode == "range":
        options.update(lock_key="doc", lock_range=("n", "n"))
    elif mode == "keys":
        options = {"lock_keys": ["doc-{n}", "other-{n}"]}
    elif mode == "limit":
        options["lock_limit"] = 2

    @celery_lock_app.task(base=SingletonTask, name=f"claims.host_{mode}", shared=False, **options)
    def job(n: int) -> int:
        return n

    lock = job.make_lock((7,), owner_info={"task_id": "t-7"})
    assert lock.acquire()
    pid = os.getpid()
    assert not job.release_holder((7,), task_id="t-7", pid=pid, host="another-machine")
    heartbeat().tick()
    assert lock.held
    assert job.release_holder((7,), task_id="t-7", pid=pid)  # default: this machine
    heartbeat().tick()
    assert lock.lost


def test_release_holder_leaves_the_claim_of_the_next_attempt(lock_client: LockClient) -> None:
    """A retry hands the lock to ``claim:<id>:<n+1>``; the hash still carries the task id,
    pid and host of the run that retried. When that run's process ends, the supervisor's
    cleanup must not free the claim: the retried run would lose its turn to a duplicate."""
    lease = held_by_task(lock_client, "lease", "t-retry")
    assert isinstance(lease, Lease)
    claim = claim_owner("t-retry", 1)
    lease.hand_over(claim, ttl=60.0, owner_info={"task_id": "t-retry", "state": "retry"})
    key = lease.keys.lock
    assert lock_client.redis.hget(key, "owner") == claim.encode()

    assert not lock_client.release_holder("job", task_id="t-retry", pid=os.getpid())
    assert lock_client.redis.hget(key, "owner") == claim.encode()
    assert not lock_client.lease("job").acquire()  # a duplicate still finds it taken
