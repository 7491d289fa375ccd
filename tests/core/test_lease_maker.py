"""LeaseMaker: leases with a ttl and max-hold checked once make the same leases as
LockClient.lease, and bad input still raises ConfigurationError before any Redis call."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis.asyncio

from celery_singleton_lock import ConfigurationError, LockClient
from celery_singleton_lock.aio.connection import AsyncConnection
from celery_singleton_lock.aio.lease import AsyncLease
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.embedded import free_port
from celery_singleton_lock.kinds.lease import LeaseMaker


@pytest.fixture
def dead_client() -> Iterator[LockClient]:
    """A client of a port where nothing listens: a ConfigurationError proves the argument
    was checked before any Redis call (which would raise LockBackendError)."""
    client = LockClient.from_url(f"redis://:pw@127.0.0.1:{free_port()}/0", prefix="dead:")
    yield client
    client.close()


BAD_TIMING: list[tuple[str, dict[str, Any]]] = [
    *[("ttl", {"ttl": value}) for value in [0, -1, math.nan, math.inf, True, "1", 1e300]],
    ("max_hold", {"ttl": 10, "max_hold": 5}),
    ("max_hold", {"max_hold": 0}),
    ("max_hold", {"max_hold": math.inf}),
    ("max_hold", {"max_hold": "60"}),
]

BAD_PER_LEASE: list[tuple[str, dict[str, Any]]] = [
    ("name", {"name": ""}),
    ("name", {"name": None}),
    ("name", {"name": b"bytes"}),
    ("owner_info", {"owner_info": "task"}),
    ("owner_info", {"owner_info": {1: "x"}}),
    ("owner_info", {"owner_info": {"": "x"}}),
    ("owner_info", {"owner_info": {"task_id": None}}),
    ("owner_info", {"owner_info": {"task_id": True}}),
    ("owner_info", {"owner_info": {"task_id": "lone \ud800 surrogate"}}),
    ("owner_info", {"owner_info": {"bad \udfff key": "x"}}),
    ("on_lost", {"on_lost": "print"}),
]


@pytest.mark.parametrize(("argument", "kwargs"), BAD_TIMING)
def test_a_bad_ttl_or_max_hold_is_refused_by_the_maker(
    dead_client: LockClient, argument: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError) as info:
        LeaseMaker(dead_client, **kwargs)
    assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as same:
        dead_client.lease("job", **kwargs)
    assert str(same.value) == str(info.value)


@pytest.mark.parametrize(("argument", "kwargs"), BAD_PER_LEASE)
def test_a_bad_name_owner_info_or_callback_is_refused_per_lease(
    dead_client: LockClient, argument: str, kwargs: dict[str, Any]
) -> None:
    kwargs = {"name": "job", **kwargs}
    name = kwargs.pop("name")
    with pytest.raises(ConfigurationError) as info:
        LeaseMaker(dead_client, ttl=5, max_hold=60).lease(name, **kwargs)
    assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as same:
        dead_client.lease(name, ttl=5, max_hold=60, **kwargs)
    assert str(same.value) == str(info.value)


SHAREABLE = (str, bytes, int, float, bool, type(None), tuple, frozenset)


def state_of(handle: Any) -> dict[str, Any]:
    """Every attribute a handle has set (its classes declare them in ``__slots__``)."""
    slots = {slot for cls in type(handle).__mro__ for slot in vars(cls).get("__slots__", ())}
    slots.discard("__weakref__")
    return {slot: getattr(handle, slot) for slot in sorted(slots) if hasattr(handle, slot)}


def assert_nothing_mutable_shared(one: Any, other: Any) -> None:
    """No attribute of two leases of a maker is one mutable object (a cache, a lock, a dict),
    besides the connection."""
    for attribute, value in state_of(one).items():
        if attribute == "_conn" or isinstance(value, SHAREABLE):
            continue
        assert value is not getattr(other, attribute), attribute


STATE = ("name", "ttl", "max_hold", "heartbeat", "wait", "owner_info", "fair", "take_over")
STATE += ("on_lost", "keys")


@pytest.mark.parametrize("max_hold", [None, 7.5])
@pytest.mark.parametrize(
    "owner_info", [None, {"task_name": "t", "task_id": "ïd", "n": 3, "x": 1.5}, {"a": "b"}]
)
def test_a_lease_of_a_maker_is_the_lease_the_client_makes(
    lock_client: LockClient, max_hold: float | None, owner_info: dict[str, Any] | None
) -> None:
    def on_lost(_: Any) -> None: ...

    made = LeaseMaker(lock_client, ttl=2.0001, max_hold=max_hold).lease(
        "job:é", owner_info=owner_info, on_lost=on_lost
    )
    expected = lock_client.lease("job:é", ttl=2.0001, max_hold=max_hold, owner_info=owner_info)
    expected.on_lost = on_lost
    assert type(made) is type(expected)
    assert {a: getattr(made, a) for a in STATE} == {a: getattr(expected, a) for a in STATE}
    # Every other attribute too: the same values, and no mutable part shared with another
    # lease of the maker.
    own = {"_state_lock", "_holder_cache"}
    assert set(state_of(made)) - own == set(state_of(expected)) - own
    assert {a: v for a, v in state_of(made).items() if a not in own} == {
        a: v for a, v in state_of(expected).items() if a not in own
    }
    other = LeaseMaker(lock_client, ttl=2.0001, max_hold=max_hold).lease("job:é")
    assert_nothing_mutable_shared(made, other)
    assert made.acquire()
    try:
        # The holder fields the acquire stored, from the maker's per-thread part.
        stored = lock_client.redis.hget(made.keys.lock, "holder")
        assert not expected.acquire()
        (holder,) = made.holders()
        assert holder.owner == made.owner
        assert holder.task_id == (owner_info or {}).get("task_id")
    finally:
        made.release()
    assert expected.acquire()
    assert lock_client.redis.hget(expected.keys.lock, "holder") == stored  # the same fields
    expected.release()


def test_a_lease_of_a_maker_records_the_thread_that_acquires_it(lock_client: LockClient) -> None:
    """The holder fields shared by a maker's leases are per process and thread, and
    follow a rename of the thread."""
    maker = LeaseMaker(lock_client, ttl=5)
    seen: dict[str, bytes] = {}

    def describe(label: str) -> None:
        """The holder fields a lease of the maker stores when ``label``'s thread takes it."""
        lease = maker.lease("job", owner_info={"task_id": "t"})
        assert lease.acquire()
        seen[label] = lock_client.redis.hget(lease.keys.lock, "holder")
        lease.release()

    describe("main")
    thread = threading.Thread(target=describe, args=("other",), name="csl-other-thread")
    thread.start()
    thread.join()
    current = threading.current_thread()
    old_name = current.name
    current.name = "csl-renamed"
    try:
        describe("renamed")
    finally:
        current.name = old_name

    def thread_of(packed: bytes) -> Any:
        fields = msgpack.unpackb(packed, raw=True)
        return fields[fields.index(b"thread") + 1].decode()

    assert thread_of(seen["main"]) == old_name
    assert thread_of(seen["other"]) == "csl-other-thread"
    assert thread_of(seen["renamed"]) == "csl-renamed"
    expected = lock_client.lease("job", ttl=5, owner_info={"task_id": "t"})
    assert expected.acquire()
    assert lock_client.redis.hget(expected.keys.lock, "holder") == seen["main"]
    expected.release()


def test_leases_of_one_maker_acquired_in_turn_store_their_own_holder(
    lock_client: LockClient,
) -> None:
    """In one thread, one after the other: each lease's holder record is its own (name,
    task id), whatever the maker caches for the thread."""
    maker = LeaseMaker(lock_client, ttl=5)
    for task_id, name in [("first", "job:{1}"), ("second", "job:{2}"), ("third", "job:{1}")]:
        lease = maker.lease(name, owner_info={"task_id": task_id, "task_name": "t"})
        assert lease.acquire()
        try:
            stored = flatten(lock_client.redis.hgetall(lease.keys.lock))
            assert stored[b"name"] == name.encode()
            assert stored[b"task_id"] == task_id.encode()
            assert stored[b"owner"] == lease.owner.encode()
        finally:
            lease.release()


def test_leases_are_slotted(lock_client: LockClient) -> None:
    """Handles are made per use: every class of a lease declares its attributes in
    ``__slots__`` (no per-handle ``__dict__``), sync, maker-made and asyncio."""
    maker = LeaseMaker(lock_client, ttl=5)
    leases = [lock_client.lease("job"), maker.lease("job")]
    port = lock_client.redis.connection_pool.connection_kwargs["port"]
    leases.append(AsyncLease(AsyncConnection(redis.asyncio.Redis(port=port), "csl:"), "job"))
    for lease in leases:
        assert not hasattr(lease, "__dict__"), type(lease)
        with pytest.raises(AttributeError):
            lease.not_an_attribute = 1
