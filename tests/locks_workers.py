"""Code run in child processes by the rw/range/multi tests (importable, so "spawn" can
start it). Workers talk to the test over a ``Connection`` and never sleep to synchronise."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from celery_singleton_lock import LockClient


def shared_holder(
    url: str, prefix: str, kind: str, name: str, ttl: float, conn: Connection
) -> None:
    """Take a read hold (``kind`` "rw") or a read range [0, 10] (``kind`` "range") with the
    heartbeat on, report (pid, owner), then block until killed."""
    client = LockClient.from_url(url, prefix=prefix)
    if kind == "rw":
        handle: Any = client.rwlock(name).read(ttl=ttl)
    else:
        handle = client.range_lock(name).read(0, 10, ttl=ttl)
    assert handle.acquire(wait=10)
    conn.send((os.getpid(), handle._owner))
    conn.recv()  # never comes: the test SIGKILLs this process


@contextmanager
def killable_holder(
    url: str, prefix: str, kind: str, name: str, ttl: float
) -> Iterator[tuple[int, str]]:
    """Run :func:`shared_holder` in a spawned process; yield its (pid, owner) once it holds,
    and kill it on the way out whatever happened."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(
        target=shared_holder, args=(url, prefix, kind, name, ttl, theirs), daemon=True
    )
    process.start()
    try:
        assert ours.poll(30), "the holder process did not report"
        pid, owner = ours.recv()
        yield pid, owner
    finally:
        process.kill()
        process.join(10)


def multi_worker(
    url: str, prefix: str, names: list[str], rounds: int, go: Any, conn: Connection
) -> None:
    """Take ``names`` all-or-nothing ``rounds`` times; under each hold, a non-atomic
    read-modify-write of one counter per name. Reports the tokens seen per name."""
    client = LockClient.from_url(url, prefix=prefix)
    seen: dict[str, list[int]] = {name: [] for name in names}
    go.wait(30)
    for _ in range(rounds):
        with client.multi(names, ttl=10, wait=60) as held:
            for name in names:
                key = f"{prefix}count:{name}"
                client.redis.set(key, int(client.redis.get(key) or 0) + 1)
                seen[name].append(held.tokens[name])
    conn.send(seen)
    client.close()
