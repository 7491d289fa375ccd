"""celery/sends.py: a call is a send of a message, not a task id. A replacement
(``Task.replace``) and a call re-sent under a task id that ran before are new sends, run as
any call; a broker's copy of one message (the same send) still runs at most once.

Real in-process workers on the test Redis (broker, result backend and locks).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis
from celery import Celery
from support.outcomes import Outcomes

from celery_singleton_lock import SingletonTask
from celery_singleton_lock.celery.sends import SEND_HEADER

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 60.0


def replacing_task(
    app: Celery, runs: tuple[redis.Redis, str], name: str, **options: Any
) -> tuple[Any, Any]:
    """A task that replaces itself once with a call of ``finish`` (same key), and ``finish``;
    both log ``<task>:<attempt>`` to the runs list."""
    client, runs_key = runs

    @app.task(base=SingletonTask, shared=False, bind=True, name=f"{name}.finish",
              lock_key="rp:{key}", **options)  # fmt: skip
    def finish(self: Any, key: str) -> str:
        client.rpush(runs_key, f"finish:{self.request.retries or 0}")
        return "finished"

    @app.task(base=SingletonTask, shared=False, bind=True, name=f"{name}.start",
              lock_key="rp:{key}", max_retries=1, **options)  # fmt: skip
    def start(self: Any, key: str, retry_first: bool = False) -> Any:
        client.rpush(runs_key, f"start:{self.request.retries or 0}")
        if retry_first and not self.request.retries:
            raise self.retry(countdown=0)
        raise self.replace(finish.si(key))

    return start, finish


@pytest.mark.parametrize(
    "options, retry_first",
    [
        pytest.param({"lock_release_delay": 30}, False, id="release-delay"),
        pytest.param({}, True, id="after-a-retry"),
        pytest.param({"lock_on_enqueue": True}, False, id="lock-on-enqueue"),
        pytest.param({"lock_on_enqueue": True, "lock_release_delay": 30}, True, id="all"),
    ],
)
def test_a_replacement_runs_under_the_replaced_task_id(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    runs: tuple[redis.Redis, str],
    options: dict[str, Any],
    retry_first: bool,
) -> None:
    """Celery sends the replacement under the replaced task's id: it is a new send, not a
    copy of the replaced run; the replaced run's lock is no reason to drop it (its release
    delay starts when the call ends, in the replacement)."""
    start, finish = replacing_task(celery_lock_app, runs, "rp", **options)
    client, runs_key = runs
    with in_process_worker(celery_lock_app, concurrency=2):
        result = start.delay("k", retry_first)
        assert result.get(timeout=TIMEOUT) == "finished"
    started = [b"start:0", b"start:1"] if retry_first else [b"start:0"]
    assert client.lrange(runs_key, 0, -1) == [*started, b"finish:0"]
    if options.get("lock_release_delay"):
        # The call ended in the replacement: its release delay holds the key now.
        assert finish.make_lock(("k",)).holders()


def test_a_call_resent_under_its_task_id_after_it_failed_runs_again(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    """``apply_async(task_id=...)`` of a call that failed is a new send: it runs, and its
    outcome replaces the failure."""
    client, runs_key = runs

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, lock_key="rs:{key}")
    def job(self: Any, key: str, fail: bool) -> str:
        client.rpush(runs_key, f"{key}:{fail}")
        if fail:
            raise ValueError("first try fails")
        return "ok"

    with in_process_worker(celery_lock_app, concurrency=2):
        first = job.delay("a", True)
        with pytest.raises(ValueError):
            first.get(timeout=TIMEOUT)
        again = job.apply_async(("a", False), task_id=first.id)
        # task_postrun of the first may come after the second ran: the backend had the
        # failure before that (get() raised it), the order of the signals is no rule.
        assert sorted(outcomes.wait(2)) == ["FAILURE", "SUCCESS"]
        assert again.get(timeout=TIMEOUT) == "ok"
    assert client.lrange(runs_key, 0, -1) == [b"a:True", b"a:False"]


def test_a_copy_of_a_send_that_ended_is_still_dropped_and_a_retry_keeps_its_send(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    outcomes: Outcomes,
    runs: tuple[redis.Redis, str],
) -> None:
    """A copy carries its message's send id: once that send ended (here in its retry, which
    continues the same send), the copy is dropped and stores nothing."""
    client, runs_key = runs
    sends: list[str] = []
    # The copy below is sent by hand: no setting of this app makes one.
    celery_lock_app.conf.singleton_lock_done_marks = "always"

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, lock_key="cp:{key}",
                          max_retries=1)  # fmt: skip
    def job(self: Any, key: str) -> int:
        sends.append(self.request.get(SEND_HEADER) or self.request.headers.get(SEND_HEADER))
        client.rpush(runs_key, self.request.retries or 0)
        if not self.request.retries:
            raise self.retry(countdown=0)
        return 1

    with in_process_worker(celery_lock_app, concurrency=2):
        result = job.delay("c")
        assert result.get(timeout=TIMEOUT) == 1
        assert sorted(outcomes.wait(2)) == ["RETRY", "SUCCESS"]
        assert len(sends) == 2 and sends[0] and sends[0] == sends[1]
        # The broker delivers attempt 0's message once more: same task id, same send.
        celery_lock_app.send_task(
            job.name, ("c",), task_id=result.id, headers={SEND_HEADER: sends[0]}
        )
        assert outcomes.wait(3)[2] == "IGNORED"
    assert client.lrange(runs_key, 0, -1) == [b"0", b"1"]
