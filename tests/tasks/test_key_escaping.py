"""Task ids, names and arguments are data: no value a user or broker supplies shapes a key so
that it matches another kind's listing pattern (core/keys.py ``key_part``), and a listing that
meets a key of another type than it reads skips it and counts it, rather than fail
(core/scan.py).

A task id ending in ``}:lock`` used to leave a done mark ``P{T}:done:x}:lock``, a string the
lease listing's ``P{*}:lock`` matched: ``client.locks()``, ``celery locks`` and a restarted
worker's clean-up then failed with WRONGTYPE for as long as the mark lasted (two hours).
Here real in-process workers run SingletonTasks under such ids and arguments, and every
listing is asked afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner, Result
from support.async_sides import run
from support.foreign_keys import listing_patterns, plant_foreign_keys, scanned

from celery_singleton_lock import AsyncLockClient, LockClient, SingletonTask, admin
from celery_singleton_lock.celery.claims import claim_owner
from celery_singleton_lock.celery.done_marks import DoneMark
from celery_singleton_lock.celery.waiting_marks import mark_key
from celery_singleton_lock.cli import commands
from celery_singleton_lock.core.keys import key_part, lock_pattern
from celery_singleton_lock.exceptions import ConfigurationError

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 60.0

#: Task ids (and lock arguments) a caller or broker may send: each spells, or would spell
#: inside a key, a suffix of another kind's key, a glob, an escape, a line break.
HOSTILE = [
    "x}:lock",
    "{x}:lock",
    "a}:rw:h:b",
    "a}:range:h:b",
    "a}:sem:h:b",
    "}",
    "{",
    "::",
    "*",
    "a*b?[c]\\d",
    "line\nbreak",
    "%7D",
    "}:lock\n}:lock",
]

SKIPPED_NOTE = "keys skipped: not of the expected type"


def run_plain(url: str, prefix: str, *args: str) -> Result:
    """``python -m celery_singleton_lock --url URL --prefix PREFIX ARGS``, in process."""
    options = ["--prefix", prefix, "--url", url]
    return CliRunner().invoke(commands.main, [*options, *args], catch_exceptions=False)


def run_celery(app: Celery, *args: str) -> Result:
    """``celery -A app locks ARGS``, in process."""
    from celery.bin.base import CLIContext

    obj = CLIContext(app=app, no_color=True, workdir=None)
    return CliRunner().invoke(commands.locks, list(args), obj=obj, catch_exceptions=False)


def hold_stale(client: LockClient, name: str) -> None:
    """A lease whose holder's heartbeat stopped a minute ago: what ``clear --stale`` clears."""
    lease = client.lease(name, ttl=60, heartbeat=False)
    assert lease.acquire()
    renewed = admin.server_ms(client) - 60_000
    client.redis.hset(lease.keys.lock, mapping={"heartbeat": 1, "renewed_ms": renewed})


# -- the keys themselves -----------------------------------------------------------------------


def test_key_part_escapes_what_could_shape_a_key_and_nothing_else() -> None:
    assert key_part("0b5e6c1e-7a4c-4d5e-9f00-1d2c3b4a5f6e") == (
        "0b5e6c1e-7a4c-4d5e-9f00-1d2c3b4a5f6e"  # a UUID task id is unchanged
    )
    assert key_part("x}:lock") == "x%7D%3Alock"
    assert key_part("a*b?[c]\\d") == "a%2Ab%3F%5Bc%5D%5Cd"
    assert key_part("line\nbreak") == "line%0Abreak"
    assert key_part("ünï") == "ünï"
    # One value, one part: the escape character is escaped too.
    parts = [key_part(value) for value in HOSTILE]
    assert len(set(parts)) == len(HOSTILE)
    assert key_part("%7D") != key_part("}")
    for part in parts:
        assert not set(part) & set("{}:*?[]\\\n")


def test_no_mark_or_claim_of_a_hostile_task_id_matches_a_listing_pattern(
    lock_client: LockClient, lock_prefix: str
) -> None:
    """The Celery layer's own keys (done and wait marks, a claim's fair-waiting keys), written
    for each hostile id under lock names of every shape, are never what a listing SCANs for,
    so every listing still sees nothing."""
    connection = lock_client.connection
    written: list[bytes] = []
    for task_id in HOSTILE:
        for name in ("plain", f"job:{task_id}"):
            lease = lock_client.lease(name)
            done = DoneMark.of(connection, lease, task_id, 0, 60.0).key
            waiting = mark_key(connection, lease, task_id, 0)
            connection.redis.hset(done, "", 0)
            connection.redis.pexpire(done, 60_000)
            connection.redis.set(waiting, "w|1|h|n", px=60_000)
            written += [done, waiting]
    assert len(set(written)) == len(written)  # no two ids share a mark
    for pattern in listing_patterns(lock_prefix):
        assert scanned(lock_client, pattern) == []
    infos = lock_client.locks()
    assert (infos, infos.skipped) == ([], 0)


def test_a_claim_owner_carries_its_task_id_escaped_and_callers_owners_have_no_braces(
    lock_client: LockClient,
) -> None:
    assert claim_owner("x}:lock", 3) == "claim:x%7D%3Alock:3"
    for owner in ("x}:lock", "{x", "a}:rw:h:b"):
        with pytest.raises(ConfigurationError, match="owner"):
            lock_client.lease("n", owner=owner, fair=True)
        with pytest.raises(ConfigurationError, match="take_over"):
            lock_client.lease("n", take_over=owner)
        with pytest.raises(ConfigurationError, match="owner"):
            lock_client.release_owner("n", owner)
    lease = lock_client.lease("n", ttl=30)
    assert lease.acquire()
    with pytest.raises(ConfigurationError, match="owner"):
        lease.hand_over("x}:lock", ttl=30)
    lease.release()


# -- real workers, hostile task ids and arguments ----------------------------------------------


@pytest.fixture
def app(celery_lock_app: Celery) -> Iterator[Celery]:
    yield celery_lock_app


def test_tasks_run_under_hostile_ids_and_every_listing_still_works(
    app: Celery,
    in_process_worker: WorkerFactory,
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
) -> None:
    app.conf.singleton_lock_done_marks = "always"  # the marks' keys are escaped too

    @app.task(base=SingletonTask, shared=False, lock_key="job:{key}")
    def job(key: str) -> str:
        return key

    @app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def claimed(key: str) -> str:
        return key

    hold_stale(lock_client, "dead")
    with in_process_worker(app):
        for task_id in HOSTILE:
            for task in (job, claimed):
                call_id = task_id if task is job else f"claimed-{task_id}"
                result = task.apply_async((task_id,), task_id=call_id)
                assert result.id == call_id
                assert result.get(timeout=TIMEOUT) == task_id
                # Each run left its done mark, as it should (a copy of it is dropped).
                handle = task.make_lock((task_id,))
                mark = DoneMark.of(lock_client.connection, handle, call_id, 0, 1.0)
                assert lock_client.redis.hvals(mark.key) == [b"0"]

    infos = lock_client.locks()
    assert [info.name for info in infos] == ["dead"] and infos.skipped == 0
    for pattern in listing_patterns(lock_prefix):
        assert scanned(lock_client, pattern) == [lock_client.connection.keys("dead").lock] * (
            pattern == lock_pattern(lock_prefix)
        )

    listed = run_plain(lock_redis_url, lock_prefix, "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [lock["name"] for lock in json.loads(listed.stdout)] == ["dead"]
    assert SKIPPED_NOTE not in listed.stderr
    unqueued = run_celery(app, "clear", "--unqueued", "--yes")
    assert unqueued.exit_code == 1 and "nothing cleared" in unqueued.stderr, unqueued.output
    cleared = run_plain(lock_redis_url, lock_prefix, "clear", "--stale", "--yes")
    assert cleared.exit_code == 0 and "cleared 1 of 1" in cleared.stdout, cleared.output
    assert lock_client.locks() == []


def test_a_claim_queued_under_a_hostile_id_is_listed_and_taken_over_by_its_run(
    app: Celery, in_process_worker: WorkerFactory, lock_client: LockClient, lock_prefix: str
) -> None:
    """A claim's owner token carries the escaped task id; the run finds it by the same
    escaping and takes it over (a mismatch would leave the run skipped behind its own
    claim)."""

    @app.task(base=SingletonTask, shared=False, lock_key="{key}", lock_on_enqueue=True)
    def claimed(key: str) -> str:
        return key

    task_id = "q}:lock"
    result = claimed.apply_async(("k}:lock",), task_id=task_id)
    (info,) = lock_client.locks()
    assert (info.state, info.task_id, info.owner) == (
        admin.QUEUED,
        task_id,
        "claim:q%7D%3Alock:0",
    )
    with in_process_worker(app):
        assert result.get(timeout=TIMEOUT) == "k}:lock"
    assert lock_client.locks() == []


# -- a foreign key of the wrong type -----------------------------------------------------------


@pytest.fixture
def foreign(lock_client: LockClient, lock_prefix: str) -> Iterator[list[bytes]]:
    """:func:`plant_foreign_keys`, deleted after the test."""
    keys = plant_foreign_keys(lock_client, lock_prefix)
    yield keys
    lock_client.redis.delete(*keys)


def test_every_listing_skips_a_foreign_key_of_another_type_and_counts_it(
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
    foreign: list[bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = lock_client.lease("held", ttl=30)
    assert lease.acquire()
    hold_stale(lock_client, "dead")
    read = lock_client.rwlock("shared").read(ttl=30)
    assert read.acquire()

    with caplog.at_level("WARNING", logger="celery_singleton_lock.admin"):
        infos = lock_client.locks()
    assert sorted(info.name for info in infos) == ["dead", "held", "shared"]
    assert infos.skipped == len(foreign)
    assert f"{len(foreign)} {SKIPPED_NOTE}" in caplog.text
    stale = lock_client.locks("de*")  # a pattern: still the same SCAN, still skipped
    assert [info.name for info in stale] == ["dead"] and stale.skipped == len(foreign)

    async def async_listing() -> admin.Listing:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            return await client.locks()
        finally:
            await client.close()

    async_infos = run(async_listing())
    assert sorted(info.name for info in async_infos) == ["dead", "held", "shared"]
    assert async_infos.skipped == len(foreign)

    table = run_plain(lock_redis_url, lock_prefix, "list")
    assert table.exit_code == 0, table.output
    assert f"{len(foreign)} {SKIPPED_NOTE}" in table.stderr
    assert SKIPPED_NOTE not in table.stdout
    as_json = run_plain(lock_redis_url, lock_prefix, "list", "--json")
    assert as_json.exit_code == 0 and f"{len(foreign)} {SKIPPED_NOTE}" in as_json.stderr
    assert sorted(lock["name"] for lock in json.loads(as_json.stdout)) == [
        "dead",
        "held",
        "shared",
    ]
    cleared = run_plain(lock_redis_url, lock_prefix, "clear", "--stale", "--yes")
    assert cleared.exit_code == 0 and "cleared 1 of 1" in cleared.stdout, cleared.output
    assert f"{len(foreign)} {SKIPPED_NOTE}" in cleared.stderr
    assert sorted(info.name for info in lock_client.locks()) == ["held", "shared"]
    # The foreign keys are not ours: left as they were.
    assert [lock_client.redis.type(key) for key in foreign] == [b"string", b"list", b"set"]
