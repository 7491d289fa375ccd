"""The lease's public claim API: hold under a fixed owner token (``owner``), take over a
claim (``take_over``), pass a held lease to a claim (``hand_over``), release a claim no
handle holds (``LockClient.release_owner``), and read who holds a name (``holders``).

The Celery layer's claims (enqueue-time locks, retries) are built on exactly these; these
tests pin the contract, its interleavings with another owner, and its argument checks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from celery_singleton_lock import (
    ConfigurationError,
    HolderRecord,
    LockClient,
    LockError,
    LockLost,
    LockNotHeld,
    ReleaseResult,
)
from celery_singleton_lock.embedded import free_port


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
