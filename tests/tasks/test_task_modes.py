"""Reader-writer, range and multi-key locks as task options (lock_mode, lock_range,
lock_keys). Runs go through Celery's tracer with ``apply()`` in threads: real locks on the
test Redis, several runs at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import (
    ConfigurationError,
    Lease,
    MultiLease,
    RangeLockHandle,
    RWLockHandle,
    SingletonTask,
)
from celery_singleton_lock.celery.testing import TaskLocks
from celery_singleton_lock.core.handle import LockHandle

TIMEOUT = 30


@contextmanager
def running(task: Any, *args: Any) -> Iterator[Callable[[], Any]]:
    """Run ``task.apply(args)`` in a thread until the block ends; the body must wait on the
    task's ``gate`` Event, and sets ``entered`` when inside. Yields the result getter."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(task.apply(args=args).get()))
    task.entered.clear()
    thread.start()
    assert task.entered.wait(TIMEOUT), "the run did not start"
    try:
        yield lambda: result[0]
    finally:
        task.gate.set()
        thread.join(TIMEOUT)
        task.gate.clear()


def gated(app: Celery, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Declare a SingletonTask whose body signals ``entered`` and waits for ``gate``."""

    def declare(function: Callable[..., Any]) -> Any:
        entered, gate = threading.Event(), threading.Event()

        def body(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            assert gate.wait(TIMEOUT)
            return function(*args, **kwargs)

        body.__signature__ = __import__("inspect").signature(function)  # type: ignore[attr-defined]
        task = app.task(base=SingletonTask, shared=False, name=function.__name__, **options)(body)
        task.entered, task.gate = entered, gate
        return task

    return declare


def test_readers_share_and_a_writer_waits(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @gated(celery_lock_app, lock_mode="read", lock_key="dataset:{dataset_id}")
    def export(dataset_id: int, fmt: str = "csv") -> str:
        return f"export {fmt}"

    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_mode="write", lock_key="dataset:{dataset_id}"
    )
    def rebuild(dataset_id: int) -> str:
        return "rebuilt"

    with running(export, 7, "csv"), running(export, 7, "json"):  # two readers at once
        task_locks.assert_skipped(rebuild.apply(args=[7]))
        assert task_locks.assert_ran(rebuild.apply(args=[8])) == "rebuilt"  # other dataset
    assert task_locks.assert_ran(rebuild.apply(args=[7])) == "rebuilt"


def test_upgradable_excludes_upgradable_but_not_readers(celery_lock_app: Celery) -> None:
    @gated(celery_lock_app, lock_mode="upgradable", lock_key="doc:{doc}")
    def edit(doc: int) -> str:
        return "edited"

    @celery_lock_app.task(base=SingletonTask, shared=False, lock_mode="read", lock_key="doc:{doc}")
    def view(doc: int) -> str:
        return "viewed"

    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_mode="upgradable", lock_key="doc:{doc}"
    )
    def edit_again(doc: int) -> str:
        return "edited again"

    task_locks = TaskLocks()
    with running(edit, 1):
        assert task_locks.assert_ran(view.apply(args=[1])) == "viewed"
        task_locks.assert_skipped(edit_again.apply(args=[1]))


def test_range_locks_conflict_only_where_ranges_overlap(
    celery_lock_app: Celery, task_locks: TaskLocks
) -> None:
    @gated(celery_lock_app, lock_range=("start", "end"), lock_key="ledger:{account}")
    def reprice(account: int, start: float, end: float) -> str:
        return f"{start}-{end}"

    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_range=("start", "end"), lock_key="ledger:{account}"
    )
    def recount(account: int, start: float, end: float) -> str:
        return f"{start}-{end}"

    with running(reprice, 1, 0, 100):
        task_locks.assert_skipped(recount.apply(args=[1, 50, 150]))  # overlaps
        task_locks.assert_skipped(recount.apply(args=[1, 100, 200]))  # touches: closed ends
        assert task_locks.assert_ran(recount.apply(args=[1, 101, 200])) == "101-200"
        assert task_locks.assert_ran(recount.apply(args=[2, 0, 100])) == "0-100"
    assert task_locks.assert_ran(recount.apply(args=[1, 50, 150])) == "50-150"


def test_range_readers_overlap(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @gated(celery_lock_app, lock_range=("lo", "hi"), lock_mode="read", lock_key="series")
    def scan(lo: int, hi: int) -> str:
        return "scanned"

    @celery_lock_app.task(
        base=SingletonTask,
        shared=False,
        lock_range=("lo", "hi"),
        lock_mode="read",
        lock_key="series",
    )
    def peek(lo: int, hi: int) -> str:
        return "peeked"

    with running(scan, 0, 10):
        assert task_locks.assert_ran(peek.apply(args=[5, 15])) == "peeked"
        # is_held probes with a write hold: blocked where the reader is, free elsewhere.
        assert task_locks.is_held(peek, 5, 15)
        assert not task_locks.is_held(peek, 11, 15)


def test_range_bound_must_be_a_number(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, name="modes.bad_bound", lock_range=("lo", "hi")
    )
    def job(lo: Any, hi: Any) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.apply(args=["a", 2]).get(timeout=TIMEOUT)
    assert "modes.bad_bound" in str(info.value) and "'lo'" in str(info.value)


def test_multi_key_lock_is_all_or_nothing(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @gated(celery_lock_app, lock_keys=["account:{src}", "account:{dst}"])
    def transfer(src: int, dst: int) -> str:
        return f"{src}->{dst}"

    @celery_lock_app.task(base=SingletonTask, shared=False, lock_key="account:{account}")
    def audit(account: int) -> str:
        return f"audited {account}"

    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_keys=["account:{src}", "account:{dst}"]
    )
    def refund(src: int, dst: int) -> str:
        return f"{src}->{dst}"

    with running(transfer, 1, 2):
        task_locks.assert_skipped(refund.apply(args=[2, 3]))  # shares account 2
        task_locks.assert_skipped(audit.apply(args=[1]))  # a plain lease on one of its keys
        assert task_locks.assert_ran(refund.apply(args=[3, 4])) == "3->4"
    # Nothing of the refused refund(2, 3) was left behind: account 3 is free.
    assert task_locks.assert_ran(audit.apply(args=[3])) == "audited 3"
    assert task_locks.assert_ran(refund.apply(args=[2, 3])) == "2->3"


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"lock_range": ("start", "missing")}, "modes.declared.lock_range"),
        ({"lock_keys": ["account:{nope}"]}, "modes.declared.lock_keys"),
        ({"lock_mode": "read", "lock_on_enqueue": True}, "modes.declared.lock_on_enqueue"),
        ({"lock_keys": ["a:{start}"], "lock_mode": "read"}, "modes.declared.lock_mode"),
        (
            {"lock_keys": ["a:{start}"], "lock_range": ("start", "end")},
            "modes.declared.lock_keys",
        ),
    ],
)
def test_bad_mode_options_are_refused(
    celery_lock_app: Celery, options: dict[str, Any], argument: str
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, name="modes.declared", **options)
    def job(start: int, end: int) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.lock_naming  # noqa: B018
    assert info.value.argument == argument


@pytest.mark.parametrize(
    ("options", "mode", "handle_type", "kind"),
    [
        ({}, None, Lease, "lease"),
        ({"lock_mode": "read"}, None, RWLockHandle, "read"),
        ({"lock_mode": "upgradable"}, None, RWLockHandle, "upgradable"),
        ({"lock_mode": "write"}, None, RWLockHandle, "write"),
        ({}, "write", RWLockHandle, "write"),  # the task_locks fixture's override
        ({"lock_key": "res", "lock_range": ("start", "end")}, None, RangeLockHandle, "range"),
        ({"lock_keys": ["a:{start}", "b:{end}"]}, None, MultiLease, "multi"),
    ],
)
def test_make_lock_makes_the_handle_of_the_family_the_options_select(
    celery_lock_app: Celery,
    options: dict[str, Any],
    mode: str | None,
    handle_type: type[LockHandle],
    kind: str,
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, name="modes.made", lock_ttl=600, lock_lease=20, **options
    )
    def job(start: int, end: int) -> None: ...

    info = {"task_name": "modes.made", "task_id": "t-1"}
    for _ in range(2):  # a fresh factory, then the task's cached one
        handle = job.make_lock((2,), {"end": 5}, mode=mode, owner_info=info)
        assert type(handle) is handle_type and handle.kind == kind
        assert (handle.ttl, handle.max_hold, handle.owner_info) == (20, 600, info)
        assert not handle.held and handle.name == job.lock_name((2,), {"end": 5})
    if isinstance(handle, RangeLockHandle):
        assert (handle.name, handle.mode, handle.lo, handle.hi) == ("res", "w", 2.0, 5.0)
    if isinstance(handle, MultiLease):
        assert handle.names == ("a:2", "b:5")


@pytest.mark.parametrize(
    ("options", "mode"),
    [
        ({}, "shared"),
        ({"lock_keys": ["a:{start}"]}, "read"),
        ({"lock_keys": ["a:{start}"]}, "write"),
    ],
)
def test_make_lock_refuses_a_mode_the_lock_family_has_not(
    celery_lock_app: Celery, options: dict[str, Any], mode: str
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, name="modes.refused", **options)
    def job(start: int) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.make_lock((1,), mode=mode)
    assert info.value.argument == "mode"
