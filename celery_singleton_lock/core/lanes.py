"""How a script call is sent on a plain client: on the calling thread's own connection, a
*lane*, or on a connection checked out of the client's pool.

Every acquire and every release is one EVALSHA. Checking a connection out of redis-py's pool
and back costs more Python than the rest of the call: the pool's lock twice, the fork check
twice, the observability hooks and the release event (20–30 µs of CPU per call in a busy
worker; docs/benchmarks.md). So each thread keeps one connection per pool, made with the
pool's connection class and settings, for the scripts it calls; the pool still serves every
other command (pipelines, the admin, the server clock).

What the pool gave a call, a lane gives it too:

- a connection with nothing left to read: a call that fails in any way other than a Redis
  error reply (read in full) disconnects the lane, and each call first polls it as the pool
  does at checkout (a server that closed it while idle, after a ``timeout`` or a restart,
  is reconnected to before the send, not found closed after it);
- no two calls on one connection at once: a lane belongs to one thread, and a call made on
  that thread while its lane is in use (from a signal handler) takes a pooled connection;
- a fresh connection after ``fork``: a lane made in another process is dropped unused (the
  parent keeps the socket);
- closing: a thread's lane closes when the thread ends (its thread-local storage goes), and
  :meth:`Lanes.close` closes every lane of the pool (``LockClient.close()``).

Only a pool of redis-py's own ``ConnectionPool`` class with no client-side cache gets lanes.
A ``BlockingConnectionPool`` caps the connections a process opens, which a connection per
thread outside the pool would get around; a Sentinel pool checks at each release that a
connection still goes to the primary, after a failover; a pool subclass may count or wrap
its checkouts. Those keep the pooled path. So do processes whose threads gevent or eventlet
patched: a thread-local is then a greenlet's, and each task (a greenlet of its own) would
open and close a connection.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import ConnectionError, ResponseError, TimeoutError
from redis.typing import EncodableT, KeyT

#: What a call here returns when it failed in a way the client's retry policy would try
#: again (the caller then goes through ``execute_command``, which does).
TRY_AGAIN: Any = object()
#: What :meth:`Lanes.evalsha` returns when this thread's lane is in use: call it pooled.
IN_USE: Any = object()


class _Lane:
    """One thread's connection, the process it was made in, and whether a call is on it."""

    __slots__ = ("connection", "pid", "busy")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.pid = os.getpid()
        self.busy = False

    def __del__(self) -> None:
        # The thread ended (its thread-local storage held the only reference): close the
        # socket now rather than when a garbage collection finds the connection (which
        # its parser refers back to). Not in a forked child: the socket is the parent's.
        try:
            if self.pid == os.getpid():
                self.connection.disconnect()
        except Exception:  # a finalizer must not raise (at exit, modules may be torn down)
            return


class _ThreadLanes(threading.local):
    """Each thread's own :class:`_Lane` of one pool (None until its first call)."""

    lane: _Lane | None = None


class Lanes:
    """The lanes of one connection pool, one per thread that calls scripts on it."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        # Weak: the pool is the key this object is kept under (see lanes_of).
        self._pool = weakref.ref(pool)
        self._threads = _ThreadLanes()
        #: Every lane's connection, for close(); a lane whose thread ended drops out.
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def evalsha(
        self,
        sha: str,
        keys: Sequence[KeyT],
        args: tuple[EncodableT, ...],
    ) -> Any:
        """EVALSHA on this thread's lane: its reply, :data:`TRY_AGAIN`, or :data:`IN_USE`
        (nothing sent) when the lane is in use."""
        lane = self._threads.lane
        if lane is None or lane.pid != os.getpid():
            lane = self._open()
        elif lane.busy:
            return IN_USE
        try:
            # Inside the try: an exception from a signal handler must not leave it busy.
            lane.busy = True
            return send_evalsha(lane.connection, sha, keys, args, poll=True)
        finally:
            lane.busy = False

    def _open(self) -> _Lane:
        pool = self._pool()
        assert pool is not None, "a client calls scripts on a pool it keeps alive"
        connection = pool.connection_class(**pool.connection_kwargs)
        lane = self._threads.lane = _Lane(connection)
        with self._lock:
            self._connections.add(connection)
        return lane

    def close(self) -> None:
        """Disconnect every lane (a lane still used reconnects on its next call)."""
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.disconnect()


def evalsha_on_pooled_connection(
    client: Any, sha: str, keys: Sequence[KeyT], args: tuple[EncodableT, ...]
) -> Any:
    """EVALSHA ``sha`` sent and read on a connection checked out of ``client``'s pool (the
    pool polls it at checkout), as :func:`send_evalsha` says."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        return send_evalsha(connection, sha, keys, args, poll=False)
    finally:
        pool.release(connection)


def send_evalsha(
    connection: Any, sha: str, keys: Sequence[KeyT], args: tuple[EncodableT, ...], poll: bool
) -> Any:
    """EVALSHA sent and read on ``connection``, leaving nothing unread on it: the reply, or
    :data:`TRY_AGAIN` when the connection failed and its retry policy would try again.

    A Redis error reply has been read in full and is raised; any other failure (a
    timeout, a signal's exception between the send and the read) disconnects first, so that
    no later command reads this one's reply. ``poll``: first check, as the pool does at
    checkout, that the connection has nothing to read (else it was closed by the server, or
    holds something unasked for) and reconnect if it has."""
    try:
        if poll:
            _ready(connection)
        connection.send_command("EVALSHA", sha, len(keys), *keys, *args)
        return connection.read_response()
    except ResponseError:
        raise
    except (ConnectionError, TimeoutError) as exc:
        connection.disconnect()
        if would_retry(connection.retry, exc):
            return TRY_AGAIN
        raise
    except BaseException:
        connection.disconnect()
        raise


def _ready(connection: Any) -> None:
    """Disconnect ``connection`` if it is open and has something to read (a closed socket
    reads as end of file): the send then connects afresh."""
    if connection._sock is None:
        return
    try:
        stale = connection.can_read()
    except (ConnectionError, TimeoutError, OSError):
        stale = True
    if stale:
        connection.disconnect()


def would_retry(retry: Any, error: Exception) -> bool:
    """Whether the redis-py ``retry`` policy tries a command again after ``error``."""
    if retry is None or retry.get_retries() <= 0:
        return False
    supported = getattr(retry, "_supported_errors", (ConnectionError, TimeoutError))
    return isinstance(error, tuple(supported))


_lanes: weakref.WeakKeyDictionary[Any, Lanes] = weakref.WeakKeyDictionary()
_lanes_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock another thread held at the fork stays held in the child, where that thread
    # does not run: every lock here is made anew (the child has one thread).
    global _lanes_lock
    _lanes_lock = threading.Lock()
    for lanes in list(_lanes.values()):
        lanes._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def lanes_of(client: Any) -> Lanes | None:
    """The lanes of ``client``'s pool (shared by every client on it), or None when that pool
    keeps the pooled path (see the module's text)."""
    pool = getattr(client, "connection_pool", None)
    if type(pool) is not redis.ConnectionPool or getattr(pool, "cache", None) is not None:
        return None
    if green_threads():
        return None
    with _lanes_lock:
        found = _lanes.get(pool)
        if found is None:
            found = _lanes[pool] = Lanes(pool)
        return found


def green_threads() -> bool:
    """Whether gevent or eventlet replaced this process's threads (monkey-patching)."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None and gevent.is_module_patched("threading"):
        return True
    eventlet = sys.modules.get("eventlet.patcher")
    return eventlet is not None and bool(eventlet.is_monkey_patched("thread"))
