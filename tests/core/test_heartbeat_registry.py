"""The heartbeat's registry of leases and its renewal thread: a lease collected while held,
the thread started again after it ended, and nothing a renewal or a callback raises ending
the thread that renews every lock of the process (nor a shorter lease arriving reported as
a starved thread)."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from typing import Any

import pytest
from support.waiting import wait_for

from celery_singleton_lock import Lease, LockClient, LockExpired
from celery_singleton_lock.core import heartbeat as heartbeat_module
from celery_singleton_lock.core.heartbeat import Heartbeat

#: Long enough that no tick comes during a test.
LONG_TTL = 30.0


def test_the_registry_holds_its_leases_by_plain_weak_references(lock_client: LockClient) -> None:
    """A reference callback would run wherever the collector runs, on a thread that may be
    inside the registry already (an allocation in add, or a tick listing the leases): it
    could not take the registry's lock there. So the registry's references have none, and a
    lease collected while registered simply drops out of it."""
    beat = Heartbeat()  # not the process's: a deadlock here stays in this test
    lease = lock_client.lease("collected", ttl=LONG_TTL, heartbeat=False)
    beat.add(lease)
    references = weakref.getweakrefs(lease)
    assert references and [ref.__callback__ for ref in references] == [None]
    collected = weakref.ref(lease)
    # Held by nothing but a reference cycle: only the cyclic garbage collector frees it.
    box: list[Any] = [lease]
    box.append(box)
    del lease, box, references

    def collect_then_use_the_registry() -> None:
        gc.collect()
        beat.tick()  # lists the leases: finds the dead reference and renews nothing
        beat.add(lock_client.lease("after", ttl=LONG_TTL, heartbeat=False))

    user = threading.Thread(target=collect_then_use_the_registry, daemon=True)
    user.start()
    user.join(timeout=10)
    assert not user.is_alive(), "collecting a registered lease deadlocked the registry"
    try:
        assert collected() is None
        assert beat.leases() == []  # "after" went with the thread that made it
    finally:
        beat.stop()


def test_a_stopped_heartbeat_starts_its_thread_again_with_the_next_lease(
    lock_client: LockClient,
) -> None:
    beat = Heartbeat()
    lease = lock_client.lease("again", ttl=LONG_TTL, heartbeat=False)
    assert lease.acquire()
    try:
        assert not beat.running
        beat.add(lease)
        assert beat.running
        beat.stop()  # joins the thread
        assert not beat.running
        beat.add(lease)
        assert beat.running and beat.holds(lease)
    finally:
        beat.stop()
        lease.release()


@pytest.mark.parametrize("escape", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_on_lost_raising_a_base_exception_does_not_stop_the_other_renewals(
    lock_client: LockClient, escape: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    """The callback runs on the heartbeat thread: what it raises, even SystemExit, is logged
    and the thread goes on renewing every other lease of the process."""
    calls: list[Lease] = []

    def on_lost(lease: Lease) -> None:
        calls.append(lease)
        raise escape("from on_lost")

    doomed = lock_client.lease("doomed", ttl=0.6, on_lost=on_lost)
    other = lock_client.lease("other", ttl=0.6)
    assert doomed.acquire() and other.acquire()
    lock_client.redis.delete(doomed.keys.lock)  # cleared behind its back
    wait_for(lambda: calls, 10, "the heartbeat to find the lease gone and call on_lost")
    assert doomed.lost and calls == [doomed]

    # Every renewal sets renewed_ms on the server's clock; watch it move again and again,
    # over several lease lengths: only the heartbeat thread can do that.
    seen: list[int] = []

    def renewed_three_more_times() -> bool:
        renewed = int(lock_client.redis.hget(other.keys.lock, "renewed_ms") or 0)
        if not seen or renewed != seen[-1]:
            seen.append(renewed)
        return len(seen) >= 5

    wait_for(renewed_three_more_times, 15, "the other lease to be renewed again")
    assert other.held and not other.lost
    assert any("on_lost callback" in r.getMessage() for r in caplog.records)
    other.release()


def test_on_lost_raising_a_base_exception_in_the_callers_thread_reaches_the_caller(
    lock_client: LockClient,
) -> None:
    """Only the renewal threads swallow it: when the caller's own check() finds the lock
    lost, a KeyboardInterrupt (Ctrl-C during the callback) or SystemExit is the caller's."""

    def on_lost(_: Lease) -> None:
        raise KeyboardInterrupt

    lease = lock_client.lease("interrupted", ttl=0.2, heartbeat=False, on_lost=on_lost)
    assert lease.acquire()
    wait_for(lambda: lease.lost, 10, "the lease to run out")
    with pytest.raises(KeyboardInterrupt):
        lease.check()
    with pytest.raises(LockExpired):  # found lost all the same, and once only
        lease.check()


def test_a_base_exception_escaping_a_tick_does_not_end_the_renewal_thread(
    lock_client: LockClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal loop itself catches BaseException too: the thread renews every lock of
    the process, so nothing may end it but stop()."""
    beat = Heartbeat()  # a private one: the process's own is left alone
    lease = lock_client.lease("escape", ttl=0.3, heartbeat=False)
    assert lease.acquire()
    owner = lease.owner
    real = heartbeat_module.run_batch

    def escaping(redis: Any, calls: Any, *replication: Any) -> Any:
        if any(owner in args for _, _, args in calls):
            raise SystemExit("escaped a tick")
        return real(redis, calls, *replication)

    monkeypatch.setattr(heartbeat_module, "run_batch", escaping)
    try:
        beat.add(lease)
        # Each tick counts before it renews: a third one means two escaped and it went on.
        wait_for(lambda: beat.ticks >= 3, 10, "three ticks of the private heartbeat")
        assert beat.running
        assert any("heartbeat tick failed" in r.getMessage() for r in caplog.records)
    finally:
        beat.stop()
        monkeypatch.undo()  # the lease, never renewed, runs out on its own


def test_a_shorter_lease_arriving_is_not_reported_as_a_starved_heartbeat(
    lock_client: LockClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The starvation warning is for a wait that returned late, not for a tick that became
    due at once because a shorter lease shortened the period."""
    beat = Heartbeat()
    held = []
    try:
        long = lock_client.lease("beat-long", ttl=60, heartbeat=False)
        assert long.acquire()
        held.append(long)
        beat.add(long)  # the thread now waits 20 s for its first tick
        time.sleep(2.2)  # more than two periods of the short lease below, on purpose
        short = lock_client.lease("beat-short", ttl=3, heartbeat=False)
        assert short.acquire()
        held.append(short)
        with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.heartbeat"):
            beat.add(short)
            wait_for(lambda: beat.ticks >= 1, 10, "the first tick at the shorter period")
        assert not [r for r in caplog.records if "late" in r.getMessage()], caplog.text
    finally:
        beat.stop()
        for lease in held:
            lease.release()
