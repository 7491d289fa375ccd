"""Lock signals are not sent when nothing would act on them (no receiver but the task-event
one, and the run sends no task events or was never announced), and always reach a receiver
anyone connects."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_singleton_lock import SingletonTask
from celery_singleton_lock.celery.signals import (
    LockSignal,
    lock_acquired,
    lock_lost,
    lock_released,
)

TIMEOUT = 10


def test_an_eager_run_with_only_the_event_receivers_skips_the_sends(
    celery_lock_app: Celery,
) -> None:
    seen: list[tuple[Any, ...]] = []

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True)
    def job(self: Any) -> None:
        task_id = self.request.id
        seen.append(
            (
                lock_acquired.would_act(self, task_id=task_id),
                lock_released.would_act(self, task_id=task_id),
                lock_lost.would_act(self, task_id=task_id),
            )
        )

    # Only the task-event receivers (another module, e.g. the Prometheus one, may have
    # connected its own receivers in this process).
    signals = (lock_acquired, lock_released, lock_lost)
    saved = [list(signal.receivers) for signal in signals]
    for signal in signals:
        signal.receivers[:] = [entry for entry in signal.receivers if signal.is_checked(entry[1])]
    try:
        job.apply().get(timeout=TIMEOUT)
    finally:
        for signal, receivers in zip(signals, saved, strict=True):
            signal.receivers[:] = receivers
    # An eager run sends no task events, and no run of it was announced (which the lost
    # signal's task-event receiver also needs).
    assert seen == [(False, False, False)]


def test_a_receiver_of_ours_gets_every_acquire_and_release(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job(n: int) -> int:
        return n

    got: list[tuple[str, str]] = []

    def on_acquired(name: str, **_: Any) -> None:
        got.append(("acquired", name))

    def on_released(name: str, **_: Any) -> None:
        got.append(("released", name))

    lock_acquired.connect(on_acquired)  # weak, and for any sender
    lock_released.connect(on_released, sender=job, weak=False)
    try:
        assert job.apply((1,)).get(timeout=TIMEOUT) == 1
        assert job.apply((2,)).get(timeout=TIMEOUT) == 2
    finally:
        lock_acquired.disconnect(on_acquired)
        lock_released.disconnect(on_released, sender=job)
    names = [job.lock_name((1,)), job.lock_name((2,))]
    assert got == [(kind, name) for name in names for kind in ("acquired", "released")]


def test_a_signal_with_no_receiver_at_all_is_not_wanted(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job() -> None: ...

    receivers = list(lock_acquired.receivers)
    lock_acquired.receivers[:] = []
    try:
        assert not lock_acquired.would_act(job, task_id="id-1")
        assert lock_acquired.send(sender=job, name="n", task_id="id-1", hold=None) == []
    finally:
        lock_acquired.receivers[:] = receivers


def test_a_lock_signal_sends_only_when_a_receiver_would_act() -> None:
    signal = LockSignal(name="test_signal")
    calls: list[str] = []
    acting = {"checked": False}

    def checked(sender: Any, **_: Any) -> None:
        calls.append(f"checked from {sender}")

    signal.connect_checked(checked, lambda sender, **_: acting["checked"])
    assert signal.send(sender="a", task_id="t") == []  # its test says no: no send at all
    acting["checked"] = True
    signal.send(sender="b", task_id="t")
    assert calls == ["checked from b"]

    acting["checked"] = False

    def anyones(sender: Any, **_: Any) -> None:  # no test: always sent to
        calls.append(f"anyone's from {sender}")

    signal.connect(anyones)  # weak, as a user's receiver may be
    signal.send(sender="c", task_id="t")
    assert calls[1:] == ["checked from c", "anyone's from c"]
    assert signal.is_checked(checked) and not signal.is_checked(anyones)
