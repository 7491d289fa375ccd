"""The admin core: client.locks() fields and states, token-checked clear, patterns, JSON.
A hold in a release delay is listed so, never stale; a clear of a lock listed stale checks,
in the clearing script, that it was not renewed since (its holder woke up: it keeps it)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner, Result

from celery_singleton_lock import AsyncLockClient, LockClient, LockError, LockExpired, admin
from celery_singleton_lock.admin.clear import listed_cleared
from celery_singleton_lock.cli import commands, output
from celery_singleton_lock.cli.output import to_json
from celery_singleton_lock.core import scan
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.core.steps import Steps
from celery_singleton_lock.kinds.intervals import IntervalHandle
from celery_singleton_lock.kinds.multi import MultiLease
from celery_singleton_lock.kinds.rwlock import RWLockHandle

#: The documented shape of one object of ``--json`` (docs/admin.md).
NUMBER_OR_NULL = (int, float, type(None))
LOCK_SCHEMA: dict[str, Any] = {
    "name": (str,),
    "kind": (str,),
    "state": (str,),
    "evidence": (str,),
    "task_id": (str, type(None)),
    "task_name": (str, type(None)),
    "host": (str, type(None)),
    "pid": (int, type(None)),
    "thread": (str, type(None)),
    "token": (int, type(None)),
    "owner": (str, type(None)),
    "heartbeat": (bool, type(None)),
    "age_s": NUMBER_OR_NULL,
    "lease_remaining_s": NUMBER_OR_NULL,
    "max_hold_remaining_s": NUMBER_OR_NULL,
    "heartbeat_age_s": NUMBER_OR_NULL,
    "lo": (int, float, str, type(None)),
    "hi": (int, float, str, type(None)),
    "mode": (str, type(None)),
    "info": (dict, type(None)),
    "worker": (str, type(None)),
    "task_state": (str, type(None)),
    "limit": (int, type(None)),
}


def validate(document: Any) -> None:
    """Fail unless ``document`` is a list of lock objects of the documented shape."""
    assert isinstance(document, list)
    for item in document:
        assert set(item) == set(LOCK_SCHEMA), set(item) ^ set(LOCK_SCHEMA)
        for key, types in LOCK_SCHEMA.items():
            assert isinstance(item[key], types), (key, item[key])
            assert not (isinstance(item[key], bool) and bool not in types), key
        assert item["kind"] in admin.KINDS
        assert item["state"] in ("live", "queued", "stale", "release-delay")


def by_name(client: LockClient, pattern: str | None = None) -> dict[str, admin.LockInfo]:
    return {info.name: info for info in client.locks(pattern)}


def test_fields_of_a_live_lease(lock_client: LockClient) -> None:
    info_in = {"task_id": "t-1", "task_name": "tasks.report", "job": "nightly", "day": 3}
    lease = lock_client.lease("report", ttl=30, max_hold=60, owner_info=info_in)
    assert lease.acquire()
    try:
        (info,) = lock_client.locks()
        assert (info.name, info.kind, info.state) == ("report", "lease", "live")
        assert info.evidence == admin.HEARTBEAT_FRESH
        assert (info.task_id, info.task_name) == ("t-1", "tasks.report")
        assert info.info == {"job": "nightly", "day": "3"}  # the rest of owner_info, as text
        assert (info.host, info.pid, info.thread) == (
            socket.gethostname(),
            os.getpid(),
            "MainThread",
        )
        assert info.token == lease.token and info.owner == lease.owner
        assert info.heartbeat is True
        assert info.age_s is not None and 0 <= info.age_s < 5
        assert info.lease_remaining_s is not None and 25 < info.lease_remaining_s <= 30
        assert info.max_hold_remaining_s is not None and 55 < info.max_hold_remaining_s <= 60
        assert info.heartbeat_age_s is not None and 0 <= info.heartbeat_age_s < 5
        assert (info.lo, info.hi) == (None, None)
        with pytest.raises(AttributeError):
            info.state = "stale"  # type: ignore[misc]  # frozen
    finally:
        lease.release()
    assert lock_client.locks() == []


def test_ages_use_one_server_time_call_not_the_client_clock(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = lock_client.lease("clocked", ttl=30)
    assert lease.acquire()
    real_time = lock_client.redis.time
    calls = []

    def counted() -> Any:
        calls.append(1)
        return real_time()

    monkeypatch.setattr(lock_client.redis, "time", counted)
    skewed = time.time() + 7200  # this machine's clock two hours fast
    monkeypatch.setattr(time, "time", lambda: skewed)
    (info,) = lock_client.locks()
    assert len(calls) == 1
    assert info.age_s is not None and info.age_s < 5
    lease.release()


def test_listing_scans_and_pipelines(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = [lock_client.lease(f"many-{i}", ttl=30, heartbeat=False) for i in range(30)]
    for lease in leases:
        assert lease.acquire()

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("one round trip per lock, or KEYS")

    for method in ("keys", "hgetall", "pttl", "hget", "hmget"):
        monkeypatch.setattr(lock_client.redis, method, forbidden)
    monkeypatch.setattr(scan, "BATCH", 7)  # several SCAN pages and pipelines
    assert sorted(by_name(lock_client)) == sorted(f"many-{i}" for i in range(30))


def test_a_listing_scans_each_keyspace_once(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    handles = [
        lock_client.lease("scan-lease", heartbeat=False),
        lock_client.multi(["scan-m1", "scan-m2"], heartbeat=False),
        lock_client.rwlock("scan-rw").read(heartbeat=False),
        lock_client.range_lock("scan-range").write(0, 1, heartbeat=False),
        lock_client.semaphore("scan-sem", 2).permit(heartbeat=False),
    ]
    for handle in handles:
        assert handle.acquire()
    scan_iter = lock_client.redis.scan_iter
    matches: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        matches.append(kwargs.get("match"))
        return scan_iter(*args, **kwargs)

    monkeypatch.setattr(lock_client.redis, "scan_iter", counted)
    assert sorted((info.name, info.kind) for info in lock_client.locks()) == [
        ("scan-lease", "lease"),
        ("scan-m1", "multi"),
        ("scan-m2", "multi"),
        ("scan-range", "range"),
        ("scan-rw", "read"),
        ("scan-sem", "semaphore"),
    ]
    # Leases and multi-key locks share the lease keys: four keyspaces, each scanned once.
    assert len(matches) == len(set(matches)) == 4
    matches.clear()
    # A pattern naming one lock reads its lease key directly: only the interval and
    # semaphore keyspaces.
    assert [info.kind for info in lock_client.locks("scan-m1")] == ["multi"]
    assert len(matches) == len(set(matches)) == 3
    for handle in handles:
        handle.release()


def test_stale_when_the_holders_heartbeat_stopped(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    # A real holder process with a heartbeat (ttl 3: a tick each second), then killed.
    code = textwrap.dedent(f"""
        import sys, time
        from celery_singleton_lock import LockClient
        client = LockClient.from_url({lock_redis_url!r}, prefix={lock_prefix!r})
        lease = client.lease("nightly", ttl=3, owner_info={{"task_id": "t-9"}})
        assert lease.acquire()
        print(lease.token, flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        token = int(child.stdout.readline())  # type: ignore[union-attr]
        keys = lock_client.connection.keys("nightly")
        deadline = time.monotonic() + 10
        while lock_client.redis.hget(keys.lock, "renewed_ms") is None:
            # wait for one real renewal (a lease has no renewed_ms until then): the heartbeat runs
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert by_name(lock_client)["nightly"].state == "live"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        # The key outlives its holder (as a long ttl would); only the heartbeat tells.
        lock_client.redis.pexpire(keys.lock, 30_000)
        renewed_ms = int(lock_client.redis.hget(keys.lock, "renewed_ms"))
        while admin.server_ms(lock_client) - renewed_ms <= 2000:
            time.sleep(0.05)
        info = by_name(lock_client)["nightly"]
        assert (info.state, info.evidence, info.token) == ("stale", "heartbeat stopped", token)
        assert info.heartbeat_age_s is not None and info.heartbeat_age_s > 2
        assert info.lease_remaining_s is not None and info.lease_remaining_s > 20

        # A stale lock is cleared without force, and a waiter gets the name at once.
        waiter = lock_client.lease("nightly", ttl=30)
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(wait=20)))
        thread.start()
        time.sleep(0.3)  # let the waiter subscribe (it would also wake at the 30 s expiry)
        started = time.monotonic()
        assert lock_client.clear("nightly") is True
        thread.join(10)
        assert got == [True] and time.monotonic() - started < 5
        waiter.release()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]


def test_lease_without_heartbeat_is_never_stale_by_age(lock_client: LockClient) -> None:
    lease = lock_client.lease("manual", ttl=30, heartbeat=False)
    assert lease.acquire()
    key = lease.keys.lock
    lock_client.redis.hset(key, "renewed_ms", admin.server_ms(lock_client) - 25_000)
    info = by_name(lock_client)["manual"]
    assert (info.state, info.evidence, info.heartbeat) == ("live", "no evidence", False)
    assert info.heartbeat_age_s is None
    # The same hash claiming a heartbeat is stale: the flag is what decides.
    lock_client.redis.hset(key, "heartbeat", 1)
    assert by_name(lock_client)["manual"].state == "stale"
    lease.release()


def test_a_delayed_release_is_listed_release_delay(lock_client: LockClient) -> None:
    lease = lock_client.lease("delayed", ttl=30)
    assert lease.acquire()
    lease.release(delay=20)
    info = by_name(lock_client)["delayed"]
    assert (info.state, info.evidence, info.owner) == (
        "release-delay",
        "released with a delay",
        None,
    )
    assert info.token == lease.token and info.heartbeat_age_s is None
    assert info.lease_remaining_s is not None and 15 < info.lease_remaining_s <= 20
    assert lock_client.clear("delayed") is True  # not live: no force needed
    assert lock_client.lease("delayed").acquire()


def test_claim_is_queued_whatever_its_renewal_age(lock_client: LockClient) -> None:
    lease = lock_client.lease("claimed", ttl=30, owner="claim:t-5:0", heartbeat=False)
    assert lease.acquire()
    lock_client.redis.hset(lease.keys.lock, mapping={"renewed_ms": 1})
    info = by_name(lock_client)["claimed"]
    assert (info.state, info.evidence) == ("queued", admin.CLAIMED)
    # Its age is how long it has waited, from its expiry on the server's clock.
    assert info.age_s is not None and 0 <= info.age_s < 5
    with pytest.raises(LockError, match="queued"):
        lock_client.clear("claimed")  # a queued call's claim goes only with force
    assert lock_client.clear("claimed", force=True)


def test_clear_live_refused_without_force(lock_client: LockClient) -> None:
    lease = lock_client.lease("busy", ttl=30)
    assert lease.acquire()
    with pytest.raises(LockError, match="live"):
        lock_client.clear("busy")
    assert lease.held and lock_client.redis.hget(lease.keys.lock, "owner") == lease.owner.encode()
    assert lock_client.clear("busy", force=True) is True
    # The holder learns at its next heartbeat that the lock is gone.
    heartbeat().tick()
    assert lease.lost
    with pytest.raises(LockExpired):
        lease.check()
    assert lock_client.clear("busy", force=True) is False  # nothing left
    assert lock_client.clear("never-was") is False


def test_clear_is_token_checked(lock_client: LockClient) -> None:
    old = lock_client.lease("contested", ttl=30, heartbeat=False)
    assert old.acquire()
    (listed,) = lock_client.locks()
    lock_client.redis.delete(old.keys.lock)  # the old holder's lease ran out...
    new = lock_client.lease("contested", ttl=30)
    assert new.acquire()  # ...and someone else took the name before the admin cleared
    assert admin.clear_info(lock_client, listed) is False
    assert lock_client.clear("contested", token=old.token, force=True) is False
    assert lock_client.redis.hget(new.keys.lock, "owner") == new.owner.encode()
    assert new.held
    assert lock_client.clear("contested", token=new.token, force=True) is True
    assert lock_client.locks() == []


def test_pattern_filters_names_not_keys(lock_client: LockClient, lock_prefix: str) -> None:
    names = ["report-1", "report-2", "Report-3", "other", "odd*name", "häßlich-é"]
    leases = [lock_client.lease(name, ttl=30, heartbeat=False) for name in names]
    for lease in leases:
        assert lease.acquire()
    assert sorted(by_name(lock_client)) == sorted(names)
    assert sorted(by_name(lock_client, "report-*")) == ["report-1", "report-2"]
    assert sorted(by_name(lock_client, "[Rr]eport-?")) == ["Report-3", "report-1", "report-2"]
    assert list(by_name(lock_client, "odd[*]name")) == ["odd*name"]
    assert list(by_name(lock_client, "häßlich-*")) == ["häßlich-é"]
    assert by_name(lock_client, lock_prefix + "*") == {}  # the key's prefix is not the name
    assert by_name(lock_client, "*:lock") == {}


def test_literal_patterns_are_read_by_key() -> None:
    assert admin.literal_name("plain-name") == "plain-name"
    assert admin.literal_name(admin.escape("odd*na?me[1]")) == "odd*na?me[1]"
    assert admin.literal_name("report-*") is None
    assert admin.literal_name("[ab]c") is None


def test_json_shape(lock_client: LockClient) -> None:
    a = lock_client.lease("a", ttl=30, owner_info={"task_id": "x", "task_name": "t", "n": 1})
    b = lock_client.lease("b", ttl=30, heartbeat=False, max_hold=40)
    c = lock_client.lease("c", ttl=30)
    for lease in (a, b, c):
        assert lease.acquire()
    c.release(delay=10)
    document = json.loads(to_json(lock_client.locks()))
    validate(document)
    assert [(d["name"], d["state"]) for d in document] == [
        ("a", "live"),
        ("b", "live"),
        ("c", "release-delay"),
    ]
    assert [d["info"] for d in document] == [{"n": "1"}, None, None]
    a.release()
    b.release()


def test_clear_script_ships_with_the_package() -> None:
    from celery_singleton_lock.core.scripts import source

    assert "'clear' the admin's clear" in source("release")


def test_reader_writer_and_multi_locks_are_listed_and_cleared(lock_client: LockClient) -> None:
    doc = lock_client.rwlock("doc")
    first, second, upgradable = doc.read(ttl=30), doc.read(ttl=30), doc.upgradable(ttl=30)
    both = lock_client.multi(["m1", "m2"], ttl=30, owner_info={"task_id": "mt"})
    for handle in (first, second, upgradable, both):
        assert handle.acquire()
    hold = lock_client.lease("plain", ttl=30)
    assert hold.acquire()
    infos = lock_client.locks()
    assert [(i.name, i.kind) for i in infos] == [
        ("doc", "read"),
        ("doc", "read"),
        ("doc", "upgradable"),
        ("m1", "multi"),
        ("m2", "multi"),
        ("plain", "lease"),
    ]
    assert all(i.state == "live" and i.evidence == admin.HEARTBEAT_FRESH for i in infos)
    assert {i.task_id for i in infos if i.kind == "multi"} == {"mt"}
    validate(json.loads(to_json(infos)))  # [-inf, +inf] of a whole-name hold is not shown

    # One reader cleared by its token; the other reader and the upgradable keep theirs.
    (listed,) = [i for i in infos if i.token == first.token]
    assert admin.clear_info(lock_client, listed) is True
    # The same clear again is what a clear sent again after its reply was lost looks like:
    # answered cleared, as a lease's is.
    assert admin.clear_info(lock_client, listed) is True
    assert sorted(i.token for i in lock_client.locks("doc")) == sorted(
        [second.token, upgradable.token]
    )
    with pytest.raises(LockError, match="live"):
        lock_client.clear("doc")
    assert lock_client.clear("doc", force=True) is True
    assert lock_client.clear("m1", force=True) is True
    assert [i.name for i in lock_client.locks()] == ["m2", "plain"]
    hold.release()

    # A multi-key lock released with a delay leaves ownerless hashes: listed, clearable.
    delayed = lock_client.multi(["c1", "c2"], ttl=30)
    assert delayed.acquire()
    delayed.release(delay=20)
    listed_delayed = lock_client.locks("c?")
    assert [(i.name, i.kind, i.state) for i in listed_delayed] == [
        ("c1", "multi", "release-delay"),
        ("c2", "multi", "release-delay"),
    ]
    assert lock_client.clear("c1") is True
    assert lock_client.lease("c1").acquire() and not lock_client.lease("c2").acquire()


def test_range_locks_show_their_interval_and_mode(
    lock_client: LockClient, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = lock_client.range_lock("ledger")
    writer = ledger.write(10, 20, ttl=30)
    reader = ledger.read(30.5, math.inf, ttl=30, owner_info={"task_id": "r1"})
    for handle in (writer, reader):
        assert handle.acquire()
    infos = lock_client.locks("ledger")
    assert [(i.kind, i.mode, i.lo, i.hi) for i in infos] == [
        ("range", "write", 10, 20),
        ("range", "read", 30.5, "inf"),
    ]
    document = json.loads(to_json(infos))  # strict JSON: no Infinity
    validate(document)
    output.show_list(infos, as_json=False, color=False)
    table = capsys.readouterr().out
    assert re.search(r"^ledger \[10, 20\] +range/write ", table, re.MULTILINE), table
    (listed,) = [i for i in infos if i.token == writer.token]
    assert admin.clear_info(lock_client, listed) is True
    assert [i.mode for i in lock_client.locks("ledger")] == ["read"]
    again = ledger.write(12, 15, ttl=30)
    assert again.acquire(wait=0)  # the cleared interval is free again
    again.release()
    reader.release()


# -- a reader-writer or range hold in a release delay is listed so, and --stale leaves it ----


#: The release delay the tests release with, and the least PTTL that shows it is intact.
DELAY = 60.0
INTACT_MS = 50_000
KINDS = ["lease", "multi", "read", "write", "range"]


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
    assert lock_client.redis.pttl(handle.keys.holder(owner)) > INTACT_MS
    assert [i.state for i in lock_client.locks("cool")] == ["release-delay"]

    # Cleared by name, as a lease's release delay is: explicit, and not live.
    assert lock_client.clear("cool") is True
    assert lock_client.locks("cool") == []


# -- clear --stale re-checks staleness in the clear itself -----------------------------------


def pause_heartbeat(client: LockClient, handle: Any) -> None:
    """What a holder paused for a minute (GC, VM stop) looks like: its last renewal is old.
    The heartbeat stops renewing it, so that no background tick lands between this and the
    listing; ``handle.extend()`` is the holder waking up (it renews and rejoins the heartbeat)."""
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


@pytest.mark.parametrize("kind", KINDS)
def test_async_stale_clear_leaves_a_lock_whose_heartbeat_resumed(
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asyncio client's admin view re-checks staleness in the clearing script too."""
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

    def clear_listed(client: AsyncLockClient, info: admin.LockInfo, force: bool = False) -> Any:
        """The admin's clear of a listed holder, its steps run on the asyncio connection."""
        return client.connection.run(listed_cleared(client.connection, info, force))

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
