"""Interleavings that used to break a lock's promises, each driven step by step.

- A renewal already decided on (the heartbeat read its owner tokens, or its batch was on the
  wire) when ``release(delay=...)`` runs must not cut the release delay short, whatever kind.
- A reader-writer or range hold in a release delay is listed release-delay, never stale, and
  ``clear --stale`` leaves it alone.
- A clear of a lock listed stale re-checks, in the clearing script, that it was not renewed
  since: a holder whose heartbeat resumed (a pause, a prompt left open) keeps its lock.
- Only the holder's own worker node may say its task is not running, and a fresh heartbeat
  always wins: a busy solo worker's lock is not stale because another worker answered.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.utils.nodenames import host_format
from click.testing import CliRunner, Result
from support.waiting import start_celery_worker, wait_for

from celery_singleton_lock import LockClient, LockError, SingletonTask, admin
from celery_singleton_lock.admin.clear import listed_cleared
from celery_singleton_lock.celery.evidence import worker_check
from celery_singleton_lock.cli import commands
from celery_singleton_lock.core.heartbeat import heartbeat, renew_calls
from celery_singleton_lock.core.scripts import run_batch
from celery_singleton_lock.core.steps import Steps

#: The release delay the tests release with, and the least PTTL that shows it is intact.
DELAY = 60.0
INTACT_MS = 50_000


def renew_as_sent(client: LockClient, handle: Any, owner: str) -> list[int]:
    """Run the renewal the heartbeat builds for ``handle`` with owner token ``owner``."""
    calls, decode = renew_calls(client, [(handle, owner, *handle._renewal)])
    return decode(client.connection.call(run_batch, client.redis, calls))


def make_handle(client: LockClient, kind: str, **options: Any) -> Any:
    if kind == "lease":
        return client.lease("cool", ttl=3, **options)
    if kind == "multi":
        return client.multi(["cool-a", "cool-b"], ttl=3, **options)
    if kind == "read":
        return client.rwlock("cool").read(ttl=3, **options)
    if kind == "write":
        return client.rwlock("cool").write(ttl=3, **options)
    assert kind == "range"
    return client.range_lock("cool").write(0, 10, ttl=3, **options)


def hold_keys(handle: Any, owner: str) -> list[bytes]:
    """The keys whose expiry is the hold's release delay."""
    from celery_singleton_lock.kinds.intervals import IntervalHandle
    from celery_singleton_lock.kinds.multi import MultiLease
    from celery_singleton_lock.kinds.rwlock import RWLockHandle

    if isinstance(handle, MultiLease):
        return [k.lock for k in handle.keys]
    if isinstance(handle, RWLockHandle):  # its hold's hash, and the lock hash naming it
        return [handle.keys.holder(owner), handle.keys.lock]
    if isinstance(handle, IntervalHandle):
        return [handle.keys.holder(owner)]
    return [handle.keys.lock]


def assert_delay_intact(client: LockClient, handle: Any, owner: str) -> None:
    for key in hold_keys(handle, owner):
        assert client.redis.pttl(key) > INTACT_MS, key
    if hasattr(handle, "mode") and hasattr(handle.keys, "indexes"):
        # A range hold: its index entry keeps the interval locked.
        now_ms = int(client.server_time() * 1000)
        expiry = client.redis.zscore(handle.keys.indexes[0], owner)
        assert expiry is not None and expiry - now_ms > INTACT_MS


KINDS = ["lease", "multi", "read", "write", "range"]


@pytest.mark.parametrize("kind", KINDS)
def test_renewal_with_the_old_owner_after_a_delayed_release(
    lock_client: LockClient, kind: str
) -> None:
    # The tick read the owner token, then the holder released with a delay, then the
    # renewal reached Redis.
    handle = make_handle(lock_client, kind)
    assert handle.acquire()
    owner = handle.owner
    handle.release(delay=DELAY)
    (code,) = renew_as_sent(lock_client, handle, owner)
    assert code <= 0
    assert_delay_intact(lock_client, handle, owner)
    assert not handle.lost  # a released handle is not lost for a late renewal


@pytest.mark.parametrize("kind", KINDS)
def test_tick_of_a_handle_released_after_it_was_listed(lock_client: LockClient, kind: str) -> None:
    # The tick listed the handle, then the holder released (dropping its owner token), then
    # the tick read the owner tokens and renewed.
    lost: list[Any] = []
    handle = make_handle(lock_client, kind, on_lost=lost.append)
    assert handle.acquire()
    owner = handle.owner
    handle.release(delay=DELAY)
    heartbeat()._renew([handle])
    assert_delay_intact(lock_client, handle, owner)
    assert not handle.lost and lost == []  # released, not lost


def test_lease_renewal_never_matches_an_ownerless_release_delay(lock_client: LockClient) -> None:
    # Whatever a caller sends, an empty owner token is no owner.
    lease = lock_client.lease("cool", ttl=3)
    assert lease.acquire()
    lease.release(delay=DELAY)
    calls = [lock_client.connection.scripts.renew_call([(lease.keys.lock, "", 3000, 0)])]
    assert lock_client.connection.call(run_batch, lock_client.redis, calls) == [[-1]]
    assert lock_client.redis.pttl(lease.keys.lock) > INTACT_MS
    both = lock_client.multi(["m-a", "m-b"], ttl=3)
    assert both.acquire()
    both.release(delay=DELAY)
    (code,) = renew_as_sent(lock_client, both, "")
    assert code == -1
    assert_delay_intact(lock_client, both, "")


# -- a reader-writer or range hold in a release delay is listed so, and --stale leaves it ----


def run_plain(client: LockClient, lock_redis_url: str, *args: str) -> Result:
    """``python -m celery_singleton_lock --url URL --prefix PREFIX ARGS``, in process."""
    options = ["--url", lock_redis_url, "--prefix", client.prefix]
    return CliRunner().invoke(commands.main, [*options, *args], catch_exceptions=False)


def age_renewal(client: LockClient, key: bytes) -> None:
    """Make the hold's last renewal look a minute old (as after a minute of release delay)."""
    client.redis.hset(key, "renewed_ms", admin.server_ms(client) - 60_000)


@pytest.mark.parametrize("kind", ["read", "write", "range"])
def test_interval_hold_in_a_release_delay_is_listed_release_delay(
    lock_client: LockClient, lock_redis_url: str, kind: str
) -> None:
    handle = make_handle(lock_client, kind)
    assert handle.acquire()
    owner = handle.owner
    handle.release(delay=DELAY)
    age_renewal(lock_client, handle.keys.holder(owner))
    (info,) = lock_client.locks("cool")
    assert (info.state, info.evidence, info.heartbeat_age_s) == (
        "release-delay",
        "released with a delay",
        None,
    )
    assert info.token == handle.token

    result = run_plain(lock_client, lock_redis_url, "clear", "--stale", "--yes")
    assert result.exit_code == 1, result.output  # nothing stale: nothing cleared
    assert_delay_intact(lock_client, handle, owner)
    assert [i.state for i in lock_client.locks("cool")] == ["release-delay"]

    # Cleared by name, as a lease's release delay is: explicit, and not live.
    assert lock_client.clear("cool") is True
    assert lock_client.locks("cool") == []


# -- clear --stale re-checks staleness in the clear itself -----------------------------------


def pause_heartbeat(client: LockClient, handle: Any) -> None:
    """What a holder paused for a minute (GC, VM stop) looks like: its last renewal is old.
    The heartbeat stops renewing it, so that no background tick lands between this and the
    listing; ``handle.extend()`` is the holder waking up (it renews and rejoins the heartbeat)."""
    from celery_singleton_lock.kinds.intervals import IntervalHandle
    from celery_singleton_lock.kinds.multi import MultiLease
    from celery_singleton_lock.kinds.rwlock import RWLockHandle

    heartbeat().remove(handle)
    assert handle.owner is not None
    if isinstance(handle, (IntervalHandle, RWLockHandle)):
        keys = [handle.keys.holder(handle.owner)]
    elif isinstance(handle, MultiLease):
        keys = [k.lock for k in handle.keys]
    else:
        keys = [handle.keys.lock]
    for key in keys:
        age_renewal(client, key)


def assert_still_held(client: LockClient, handle: Any) -> None:
    heartbeat().tick()  # a cleared holder would find out here
    assert handle.held and not handle.lost
    assert {i.state for i in client.locks("cool*")} == {"live"}


@pytest.mark.parametrize("kind", KINDS)
def test_stale_clear_leaves_a_lock_whose_heartbeat_resumed(
    lock_client: LockClient, kind: str
) -> None:
    handle = make_handle(lock_client, kind)
    assert handle.acquire()
    pause_heartbeat(lock_client, handle)
    listed = lock_client.locks("cool*")
    assert listed and {i.state for i in listed} == {"stale"}
    handle.extend()  # the holder wakes up before the admin clears
    assert [admin.clear_listed(lock_client, info) for info in listed] == [admin.RESUMED] * len(
        listed
    )
    assert [admin.clear_info(lock_client, info) for info in listed] == [False] * len(listed)
    assert_still_held(lock_client, handle)
    # Explicit force clears what was listed, live or not.
    assert {admin.clear_listed(lock_client, info, force=True) for info in listed} == {admin.CLEARED}
    heartbeat().tick()
    assert handle.lost


def test_stale_clear_still_clears_a_lock_that_stayed_stale(lock_client: LockClient) -> None:
    lease = make_handle(lock_client, "lease")
    assert lease.acquire()
    pause_heartbeat(lock_client, lease)
    (listed,) = lock_client.locks("cool")
    assert listed.state == "stale"
    assert admin.clear_listed(lock_client, listed) == admin.CLEARED
    assert lock_client.locks() == []


def test_cli_clear_stale_after_the_heartbeat_resumed(
    lock_client: LockClient, lock_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = make_handle(lock_client, "lease")
    assert lease.acquire()
    pause_heartbeat(lock_client, lease)
    confirm = commands._confirm

    def confirm_slowly(ctx: Any, infos: Any, *, yes: bool, color: bool) -> None:
        confirm(ctx, infos, yes=yes, color=color)
        lease.extend()  # while the operator read the list, the holder woke up

    monkeypatch.setattr(commands, "_confirm", confirm_slowly)
    result = run_plain(lock_client, lock_redis_url, "clear", "--stale", "--yes")
    assert result.exit_code == 1, result.output
    assert "left cool (lease, token" in result.stdout
    assert "alone: heartbeat resumed since it was listed stale" in result.stdout
    assert "cleared 0 of 1 lock(s)" in result.stdout
    assert_still_held(lock_client, lease)
    lease.release()


def test_client_clear_says_when_the_heartbeat_resumed(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = make_handle(lock_client, "lease")
    assert lease.acquire()
    pause_heartbeat(lock_client, lease)
    listing = admin.inspect.listing

    def list_then_resume(*args: Any, **kwargs: Any) -> Steps[admin.Listing]:
        infos = yield from listing(*args, **kwargs)
        lease.extend()  # the holder wakes up between the read and the clear
        return infos

    monkeypatch.setattr(admin.inspect, "listing", list_then_resume)
    with pytest.raises(LockError, match="heartbeat resumed"):
        lock_client.clear("cool")
    assert_still_held(lock_client, lease)
    lease.release()


# -- only the holder's own worker may say its task is not running ----------------------------


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


def test_singleton_task_records_its_worker_node_under_the_threads_pool(
    lock_client: LockClient, celery_lock_app: Celery
) -> None:
    # The threads pool puts the machine's name in request.hostname; the node name is needed.
    app = celery_lock_app
    node = f"csltest-threads-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    started, finish = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, bind=True, name="csltest.recorded", lock_ttl=30)
    def recorded(self: Any) -> None:
        started.set()
        finish.wait(30)

    with start_worker(
        app,
        pool="threads",
        concurrency=1,
        hostname=node,
        perform_ping_check=False,
        shutdown_timeout=20,
        loglevel="WARNING",
    ):
        try:
            result = recorded.delay()
            assert started.wait(30)
            (info,) = lock_client.locks()
        finally:
            finish.set()
        result.get(timeout=30)
    assert (info.task_id, info.worker, info.info) == (result.id, node, None)


@pytest.mark.parametrize("kind", KINDS)
def test_async_stale_clear_leaves_a_lock_whose_heartbeat_resumed(
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asyncio client's admin view re-checks staleness in the clearing script too."""
    from celery_singleton_lock import AsyncLockClient

    handle = make_handle(lock_client, kind)
    assert handle.acquire()
    # The holder renews only when the test says so: no background tick can land in between.
    heartbeat().remove(handle)
    pause_heartbeat(lock_client, handle)

    def resume() -> None:
        handle.extend()
        heartbeat().remove(handle)

    listing = admin.inspect.listing

    def list_then_resume(*args: Any, **kwargs: Any) -> Steps[admin.Listing]:
        infos = yield from listing(*args, **kwargs)
        resume()  # the holder wakes up between the read and the clear
        return infos

    def clear_listed(client: AsyncLockClient, info: admin.LockInfo, **kw: Any) -> Any:
        conn = client.connection
        return conn.run(listed_cleared(conn, info, kw.get("force", False)))

    async def admin_session() -> tuple[list[str], list[int], list[int]]:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            listed = await client.locks("cool*")
            states = [info.state for info in listed]
            resume()
            resumed = [await clear_listed(client, info) for info in listed]
            pause_heartbeat(lock_client, handle)
            monkeypatch.setattr(admin.inspect, "listing", list_then_resume)
            with pytest.raises(LockError, match="heartbeat resumed"):
                await client.clear(listed[0].name)
            forced = [await clear_listed(client, i, force=True) for i in listed]
            return states, resumed, forced
        finally:
            await client.close()

    states, resumed, forced = asyncio.run(admin_session())
    assert states and set(states) == {"stale"}
    assert resumed == [admin.RESUMED] * len(states)
    assert forced == [admin.CLEARED] * len(states)
