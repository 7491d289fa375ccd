"""What a reader-writer or range hold that could not be taken names as in its way: only the
holds that conflict with it (overlapping, and not both shared) — not a holder of a disjoint
range or a reader beside which it could have read. The skip of a task says the same."""

from __future__ import annotations

from celery import Celery

from celery_singleton_lock import LockClient, SingletonTask, is_skipped


def task_of(handle: object) -> set[str | None]:
    return {holder.task_id for holder in handle.holders()}  # type: ignore[attr-defined]


def test_a_range_hold_names_only_the_ranges_in_its_way(lock_client: LockClient) -> None:
    ranges = lock_client.range_lock("ledger")
    low = ranges.write(0, 10, owner_info={"task_id": "low"})
    high = ranges.write(20, 30, owner_info={"task_id": "high"})
    shared = ranges.read(40, 50, owner_info={"task_id": "reader"})
    for hold in (low, high, shared):
        assert hold.acquire()
    try:
        blocked = ranges.write(25, 45)
        assert not blocked.acquire()
        assert task_of(blocked) == {"high", "reader"}  # not "low": [0, 10] is disjoint
        reader = ranges.read(45, 60)
        assert reader.acquire()  # beside the other reader
        reader.release()
        overlapping = ranges.read(5, 25)
        assert not overlapping.acquire()
        assert task_of(overlapping) == {"low", "high"}
    finally:
        for hold in (low, high, shared):
            hold.release()


def test_a_reader_writer_hold_names_only_the_modes_in_its_way(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("doc")
    reader = rw.read(owner_info={"task_id": "reader"})
    upgradable = rw.upgradable(owner_info={"task_id": "upgradable"})
    assert reader.acquire() and upgradable.acquire()
    try:
        second = rw.upgradable()  # one upgradable at a time; readers share with it
        assert not second.acquire()
        assert task_of(second) == {"upgradable"}
        writer = rw.write()
        assert not writer.acquire()
        assert task_of(writer) == {"reader", "upgradable"}
    finally:
        reader.release()
        upgradable.release()


def test_a_skipped_range_task_names_the_holder_in_its_way(
    celery_lock_app: Celery, lock_client: LockClient
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_range=("start", "end"), lock_key="ledger:{account}"
    )
    def post(account: int, start: int, end: int) -> str:
        return "posted"

    ranges = lock_client.range_lock("ledger:7")
    disjoint = ranges.write(0, 10, owner_info={"task_id": "disjoint-run"})
    in_the_way = ranges.write(20, 30, owner_info={"task_id": "overlapping-run"})
    assert disjoint.acquire() and in_the_way.acquire()
    try:
        result = post.apply((7, 25, 35)).get()
        assert is_skipped(result)
        assert result["holder_task_id"] == "overlapping-run"
        assert "overlapping-run" in result["reason"]
        assert "disjoint-run" not in result["reason"]
    finally:
        disjoint.release()
        in_the_way.release()
