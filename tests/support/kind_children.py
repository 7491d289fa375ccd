"""Code run in child processes by the rw/range/multi tests (importable, so "spawn" can
start it). Workers talk to the test over a ``Connection`` and never sleep to synchronise."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from typing import Any

from celery_singleton_lock import LockClient, LockError, LockLost

#: The kinds of hold a worker can take: "rw-read", "rw-write", "range-read", "range-write"
#: (on [0, 10]), "multi" (on two names) and "semaphore" / "semaphore-pair" (a permit of a
#: semaphore of one / two permits); "rw" and "range" are older names of the reads.
ALIASES = {"rw": "rw-read", "range": "range-read"}
RANGE = (0, 10)


def multi_names(name: str) -> list[str]:
    """The two names a "multi" hold of ``name`` covers."""
    return [f"{name}-a", f"{name}-b"]


def make_handle(client: LockClient, kind: str, name: str, **options: Any) -> Any:
    """A handle (not yet acquired) of ``kind`` on lock ``name``, with ``options``."""
    kind = ALIASES.get(kind, kind)
    if kind == "rw-read":
        return client.rwlock(name).read(**options)
    if kind == "rw-write":
        return client.rwlock(name).write(**options)
    if kind == "range-read":
        return client.range_lock(name).read(*RANGE, **options)
    if kind == "range-write":
        return client.range_lock(name).write(*RANGE, **options)
    if kind == "multi":
        return client.multi(multi_names(name), **options)
    if kind == "semaphore":
        return client.semaphore(name, 1).permit(**options)
    if kind == "semaphore-pair":
        return client.semaphore(name, 2).permit(**options)
    raise ValueError(f"unknown kind {kind!r}")


def _outcome(call: Any) -> dict[str, Any]:
    """What ``call()`` did: ``{"error": None}`` or the error's class name, whether it is a
    LockLost, and its reason."""
    try:
        call()
    except LockError as exc:
        return {
            "error": type(exc).__name__,
            "lock_lost": isinstance(exc, LockLost),
            "reason": getattr(exc, "reason", None),
        }
    return {"error": None, "lock_lost": False, "reason": None}


def shared_holder(
    url: str, prefix: str, kind: str, name: str, ttl: float, conn: Connection
) -> None:
    """Take a hold of ``kind`` (see :data:`ALIASES`) with the heartbeat on, report it as a
    dict (pid, owner, token, tokens), then obey the test until killed or told to exit.

    Commands: "check": report ``held``, ``lost``, what ``check()`` did, whether the
    heartbeat still renews the hold and how often ``on_lost`` was called. "release":
    report what ``release()`` did. "exit": close the client and return.
    """
    from celery_singleton_lock.core.heartbeat import heartbeat

    client = LockClient.from_url(url, prefix=prefix)
    lost_calls: list[object] = []
    called = threading.Event()

    def on_lost(lost: object) -> None:
        lost_calls.append(lost)
        called.set()

    handle = make_handle(client, kind, name, ttl=ttl, on_lost=on_lost)
    assert handle.acquire(wait=10)
    tokens = handle.tokens if kind == "multi" else {name: handle.token}
    conn.send({"pid": os.getpid(), "owner": handle.owner, "token": handle.token, "tokens": tokens})
    while True:
        try:
            command = conn.recv()
        except EOFError:  # the test is gone
            return
        if command == "check":
            report = {"held": handle.held, "lost": handle.lost}
            report.update(_outcome(handle.check))
            report["renewed"] = heartbeat().holds(handle)
            # The heartbeat thread may have marked it lost and not yet called on_lost.
            called.wait(5)
            report["on_lost"] = len(lost_calls)
            conn.send(report)
        elif command == "release":
            conn.send(_outcome(handle.release))
        elif command == "exit":
            client.close()
            conn.send("bye")
            return


class HolderProcess:
    """A :func:`shared_holder` running in a spawned process, as the test sees it."""

    def __init__(self, process: Any, conn: Connection, report: dict[str, Any]) -> None:
        self.process = process
        self.conn = conn
        self.pid: int = report["pid"]
        self.owner: str = report["owner"]
        self.token: int = report["token"]
        #: The fencing token of each name held (one entry unless the kind is "multi").
        self.tokens: dict[str, int] = report["tokens"]

    def ask(self, command: str, timeout: float = 10.0) -> Any:
        """Send ``command`` and return the worker's answer."""
        self.conn.send(command)
        assert self.conn.poll(timeout), f"the holder did not answer {command!r} in time"
        return self.conn.recv()


@contextmanager
def holder_process(
    url: str, prefix: str, kind: str, name: str, ttl: float
) -> Iterator[HolderProcess]:
    """Run :func:`shared_holder` in a spawned process; yield it once it holds, and on the
    way out, whatever happened, resume it (it may have been SIGSTOPped) and kill it."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(
        target=shared_holder, args=(url, prefix, kind, name, ttl, theirs), daemon=True
    )
    process.start()
    theirs.close()  # the child has its own copy: an EOF here means the child is gone
    try:
        assert ours.poll(30), "the holder process did not report"
        yield HolderProcess(process, ours, ours.recv())
    finally:
        if process.pid is not None and process.is_alive():
            with suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.join(10)
        ours.close()


@contextmanager
def killable_holder(
    url: str, prefix: str, kind: str, name: str, ttl: float
) -> Iterator[tuple[int, str]]:
    """Run :func:`shared_holder` in a spawned process; yield its (pid, owner) once it holds,
    and kill it on the way out whatever happened."""
    with holder_process(url, prefix, kind, name, ttl) as holder:
        yield holder.pid, holder.owner


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
