"""The heartbeat's registry of leases: a lease collected while held, and the renewal thread
started again after it ended."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.heartbeat import Heartbeat

#: Long enough that no tick comes during a test.
LONG_TTL = 30.0


def test_a_lease_collected_while_the_registry_is_locked_does_not_deadlock_it(
    lock_client: LockClient,
) -> None:
    beat = Heartbeat()  # not the process's: a deadlock here stays in this test
    lease = lock_client.lease("collected", ttl=LONG_TTL, heartbeat=False)
    beat.add(lease)
    collected = weakref.ref(lease)
    # Held by nothing but a reference cycle: only the cyclic garbage collector frees it.
    box: list[Any] = [lease]
    box.append(box)
    del lease, box

    def collect_holding_the_registry_lock() -> None:
        # What an allocation made under the lock (add, a tick listing the leases) does
        # when it sets the collector off.
        with beat._lock:
            gc.collect()

    collector = threading.Thread(target=collect_holding_the_registry_lock, daemon=True)
    collector.start()
    collector.join(timeout=10)
    assert not collector.is_alive(), "collecting a registered lease deadlocked the registry"
    try:
        assert collected() is None
        assert beat.leases() == []
        with beat._lock:
            assert beat._period_locked() is None
            assert beat._leases == {}, "the collected lease's reference was not dropped"
    finally:
        beat.stop()


def test_a_stopped_heartbeat_starts_its_thread_again_with_the_next_lease(
    lock_client: LockClient,
) -> None:
    beat = Heartbeat()
    lease = lock_client.lease("again", ttl=LONG_TTL, heartbeat=False)
    assert lease.acquire()
    try:
        beat.add(lease)
        first = beat._thread
        assert first is not None and first.is_alive()
        beat.stop()
        assert not first.is_alive()
        beat.add(lease)
        second = beat._thread
        assert second is not None and second is not first and second.is_alive()
        assert beat.holds(lease)
    finally:
        beat.stop()
        lease.release()
