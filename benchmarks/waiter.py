"""The waiter of the hand-off benchmark, in a process of its own (what users see).

Protocol on the pipe (parent -> child, child -> parent)::

    ("wait", timeout)  ->  ("ready",)  just before the blocking acquire
                           ("got", t)  t = time.monotonic() right after acquiring; the child
                                       then releases at once (before the parent sees "got")
                           ("timeout",)
    ("stop",)              the child exits

``time.monotonic`` is CLOCK_MONOTONIC on Linux: one clock for every process of the machine.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection
from types import TracebackType

import redis

from .anchors import ANCHORS, acquire_timed

#: Spawned, not forked: the parent has heartbeat and pub/sub threads of its own.
_mp = multiprocessing.get_context("spawn")


def waiter_main(conn: Connection, anchor: str, url: str, prefix: str, name: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        handle = ANCHORS[anchor].make(client, prefix, name, 30.0)
        conn.send(("started",))
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            conn.send(("ready",))
            got = acquire_timed(handle, message[1])
            if got is not None:
                handle.release()
                conn.send(("got", got))
            else:
                conn.send(("timeout",))
        handle.close()
    except Exception as exc:  # tell the parent why, rather than just dying
        conn.send(("error", repr(exc)))
    finally:
        client.close()


class Waiter:
    """A child process that waits for one lock whenever asked."""

    def __init__(self, anchor: str, url: str, prefix: str, name: str) -> None:
        self._conn, child_conn = _mp.Pipe()
        self._process = _mp.Process(
            target=waiter_main, args=(child_conn, anchor, url, prefix, name), daemon=True
        )
        self._process.start()
        child_conn.close()
        self._expect("started", 60.0)

    def start_waiting(self, timeout: float) -> None:
        """Ask the child to block in acquire; returns once it is about to."""
        self._conn.send(("wait", timeout))
        self._expect("ready", 30.0)

    def acquired_at(self, timeout: float) -> float | None:
        """The child's ``time.monotonic()`` when it held the lock; None if it timed out."""
        message = self._recv(timeout)
        if message[0] == "timeout":
            return None
        assert message[0] == "got", message
        return float(message[1])

    def _expect(self, kind: str, timeout: float) -> None:
        message = self._recv(timeout)
        if message[0] != kind:
            raise RuntimeError(f"waiter process sent {message!r}, expected {kind!r}")

    def _recv(self, timeout: float) -> tuple[object, ...]:
        if not self._conn.poll(timeout):
            raise RuntimeError(f"waiter process silent for {timeout} s")
        try:
            message: tuple[object, ...] = self._conn.recv()
        except EOFError:
            raise RuntimeError(
                f"waiter process died (exit code {self._process.exitcode})"
            ) from None
        if message[0] == "error":
            raise RuntimeError(f"waiter process failed: {message[1]}")
        return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(("stop",))
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

    def __enter__(self) -> Waiter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
