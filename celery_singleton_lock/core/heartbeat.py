"""The per-process renewal thread.

One daemon thread per process renews every lease that process holds with ``heartbeat=True``,
in one round trip per Redis server per tick (per node of a Redis Cluster), however many
leases it holds. The tick period is the shortest lease held divided by ``TICKS_PER_TTL``, so
every lease gets more chances before it runs out.

Leases on several Redis clients are renewed concurrently, one batch per client on a small
pool of daemon threads, because a server that stops answering costs each call a socket
timeout, which is longer than a short lease: waiting for it before renewing the others would
lose their leases too. A client whose batch is still in flight when the next tick comes is
skipped by that tick (its batch reports when the call returns, and ``_renewal_failed`` marks
the leases lost once their local deadline has passed), so the thread never waits on a slow
server while others have leases to renew. With one client, the usual case, the batch runs on
the heartbeat thread and no pool is made: there is nobody else to hold up. ``tick()``, called
directly, waits for every batch it starts (and for one still in flight from the thread), so
the renewals have been applied when it returns.

Any lock kind can be renewed here, and none is named: a handle is a
:class:`.renewal.Renewable`, and what one tick sends and what its replies mean is
:mod:`.renewal`'s, the same for the asyncio heartbeat.

The thread holds only weak references: a lease object nobody can reach any more is no longer
renewed and runs out on its own. In a forked child the registry starts empty (the child holds
none of its parent's leases) and a new thread starts with the child's first lease; the
parent's renewal threads do not exist there, so the child makes its own.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..exceptions import LockBackendError
from .renewal import TICKS_PER_TTL as TICKS_PER_TTL
from .renewal import Renewable, RenewalRound, by_connection, tick_period
from .renewal import RenewEntry as RenewEntry
from .renewal import RenewUnit as RenewUnit
from .renewal import renew_calls as renew_calls
from .scripts import run_batch

log = logging.getLogger("celery_singleton_lock.heartbeat")

#: Set while this thread applies renewal results (the heartbeat's threads, or ``tick()``).
_renewing = threading.local()


def renewing() -> bool:
    """True while this thread is applying renewal results: a callback run from there (such
    as ``on_lost``) must not end the thread, which renews every lock of the process."""
    return bool(getattr(_renewing, "active", False))


class Heartbeat:
    """The registry of leases to renew, and the thread that renews them."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, weakref.ReferenceType[Renewable]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # True from the thread's start until its _run returns (set and cleared under _lock).
        self._running = False
        self._period: float | None = None  # what the thread is waiting on; None: idle
        self._recent_period: float | None = None  # of the last lease added
        # When the thread was last started or woken for a lease (monotonic; None: it has
        # answered), and that lease's period: an answer later than that period is starvation.
        self._called_at: float | None = None
        self._called_period = 0.0
        self.ticks = 0
        # Made lazily, and afresh in a forked child: the parent's workers do not exist there.
        self._workers: _Workers | None = None
        # id(client) -> set when that client's batch returns; its own lock, so allocating
        # here never runs the registry's weakref callbacks (which take ``_lock``) under it.
        self._flight_lock = threading.Lock()
        self._in_flight: dict[int, threading.Event] = {}

    def add(self, lease: Renewable) -> None:
        """Renew ``lease`` from now on (again, if its ttl changed)."""
        period = lease.ttl / TICKS_PER_TTL
        with self._lock:
            # No callback on the reference: the garbage collector may run one on a thread
            # that holds _lock already (an allocation in here), which would deadlock on it.
            # The thread drops the references of leases collected while held (_period_locked).
            self._leases[id(lease)] = weakref.ref(lease)
            # The flag, not Thread.is_alive(): this is on every acquire's path, and the
            # thread clears it itself when it ends (see _run).
            if not self._running:
                self._stop.clear()
                thread = threading.Thread(
                    target=self._run, name="celery_singleton_lock-heartbeat", daemon=True
                )
                thread.start()
                self._thread, self._running = thread, True
                self._call_locked(period)
            # Waking the thread costs a context switch on every acquire; only do it when the
            # thread must wait less than it does now.
            self._recent_period = period
            wake = self._period is None or period < self._period
            if wake:
                self._call_locked(period)
        if wake:
            self._wake.set()

    def _call_locked(self, period: float) -> None:
        if self._called_at is None:
            self._called_at, self._called_period = time.monotonic(), period

    def _answered(self) -> None:
        """The thread runs after a start or a wake-up: say so if that came too late."""
        with self._lock:
            called_at, period, self._called_at = self._called_at, self._called_period, None
        if called_at is not None:
            _warn_if_starved(time.monotonic() - called_at - period, period)

    def remove(self, lease: Renewable) -> None:
        """Stop renewing ``lease`` (released, lost, or past its max-hold)."""
        with self._lock:
            self._leases.pop(id(lease), None)

    def holds(self, lease: Renewable) -> bool:
        with self._lock:
            ref = self._leases.get(id(lease))
        return ref is not None and ref() is lease

    def leases(self) -> list[Renewable]:
        """The live leases being renewed."""
        with self._lock:
            refs = list(self._leases.values())
        return [lease for lease in (ref() for ref in refs) if lease is not None]

    def _period_locked(self) -> float | None:
        """Seconds between ticks (None: nothing held)."""
        held: list[Renewable] = []
        for key, ref in list(self._leases.items()):
            lease = ref()
            if lease is None:
                del self._leases[key]  # collected while held: nothing left to renew
            else:
                held.append(lease)
        return tick_period(held)

    @property
    def running(self) -> bool:
        """Whether the renewal thread is alive: from the first lease added until
        :meth:`stop` (and again from the next lease added after it). What a health check
        reports; a process whose leases are held with ``heartbeat=True`` needs it True."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + 5
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(deadline)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._lock:
                if self._thread is threading.current_thread():
                    self._running = False  # the next add() starts a thread again

    def _loop(self) -> None:
        last_tick = time.monotonic()
        lingered = False
        self._answered()
        while not self._stop.is_set():
            with self._lock:
                period = self._period_locked()
                if period is None and not lingered:
                    # Nothing held (the lease that woke us may be gone already): keep a
                    # cadence for one more period before idling, so a process that takes
                    # and releases leases in a loop does not wake this thread (a context
                    # switch) on every acquire.
                    period, lingered = self._period or self._recent_period, True
                elif period is not None:
                    lingered = False
                self._period = period
            if period is None:
                self._wake.wait()
                self._wake.clear()
                self._answered()
                last_tick = time.monotonic()
                lingered = False  # a lease came: linger again once it is gone
                continue
            due = last_tick + period
            timeout = due - time.monotonic()
            if timeout > 0:
                if self._wake.wait(timeout):
                    self._wake.clear()
                    self._answered()
                    continue  # a lease came or its ttl changed: recompute the period
                # Only a wait that returned late says the thread was starved; a tick already
                # due when the period shrank (a shorter lease came) is not late.
                _warn_if_starved(time.monotonic() - due, period)
            if self._stop.is_set():
                break
            now = time.monotonic()
            last_tick = now
            try:
                self._tick(wait=False)
            except BaseException:
                # Never let the renewal thread die: it renews every lock of the process, and
                # a SystemExit from a callback would end it silently.
                log.exception("heartbeat tick failed")

    def tick(self) -> None:
        """Renew every registered lock now: one round trip per Redis client, the clients
        concurrently. Returns once every renewal has been applied."""
        self._tick(wait=True)

    def _tick(self, *, wait: bool) -> None:
        """``wait``: also wait for a client's batch still in flight, then renew it again;
        else skip that client, and return without waiting for the batches started."""
        by_client = by_connection(self.leases())
        self.ticks += 1
        if len(by_client) == 1 and not self._in_flight:
            (handles,) = by_client.values()
            self._renew(handles)
            return
        batches = [
            self._batch(key, handles, claimed=not wait)
            for key, handles in by_client.items()
            if wait or self._claim(key, block=False)
        ]
        if not batches:
            return
        # A caller that waits anyway runs one batch itself, so a tick costs no thread more
        # than it has clients at once.
        inline = batches.pop() if wait else None
        if batches:
            pool = self._pool()
            for run, _ in batches:
                try:
                    pool.submit(run)
                except RuntimeError:  # no new thread at interpreter exit: renew here instead
                    run()
        if inline is not None:
            inline[0]()
            for _, done in batches:
                done.wait()

    def _pool(self) -> _Workers:
        with self._lock:
            if self._workers is None:
                self._workers = _Workers()
            return self._workers

    def _claim(self, key: int, *, block: bool) -> bool:
        """Mark client ``key`` as having a batch in flight; if one already is, wait for it
        to return first (``block``) or give up."""
        while True:
            with self._flight_lock:
                running = self._in_flight.get(key)
                if running is None:
                    self._in_flight[key] = threading.Event()
                    return True
            if not block:
                return False
            running.wait()

    def _batch(
        self, key: int, handles: list[Renewable], *, claimed: bool
    ) -> tuple[Callable[[], None], threading.Event]:
        """The renewal of one client's ``handles`` as a job, and an Event set when it ran."""
        done = threading.Event()

        def run() -> None:
            try:
                if not claimed:
                    self._claim(key, block=True)
                try:
                    self._renew(handles)
                finally:
                    with self._flight_lock:
                        self._in_flight.pop(key).set()
            finally:
                done.set()

        return run, done

    def _renew(self, handles: list[Renewable]) -> None:
        """One round trip (per node on a Cluster): script calls batched in a pipeline."""
        renewal = RenewalRound(handles)
        if not renewal.entries:
            return
        conn = renewal.conn
        sent_at = time.monotonic()
        try:
            replies = conn.call(run_batch, conn.redis, renewal.calls, conn.replication)
        except LockBackendError as exc:
            with _applying():
                renewal.failed(exc)
            return
        with _applying():
            renewal.renewed(replies, sent_at, self.holds)


@contextmanager
def _applying() -> Iterator[None]:
    """Mark this thread as applying renewal results (see :func:`renewing`)."""
    was = renewing()
    _renewing.active = True
    try:
        yield
    finally:
        _renewing.active = was


def _warn_if_starved(late: float, period: float) -> None:
    """Say so when a tick comes more than a whole period late: the process did not let the
    heartbeat run (a task body computing without ever yielding under the gevent or eventlet
    pool, where this thread is a greenlet; a C call holding the GIL), so leases held meanwhile
    may have run out while their holders still ran."""
    if late > period:
        log.warning(
            "heartbeat ran %.1f s late (it renews every %.1f s): nothing let it run; leases "
            "shorter than the wait may have run out. Under the gevent or eventlet pool a task "
            "body must pause (gevent.sleep(0.001) / eventlet.sleep(0.001), or any I/O) more "
            "often than lock_lease / %d, or lock_lease must be longer than its longest stretch "
            "without pausing",
            late + period,
            period,
            TICKS_PER_TTL,
        )


class _Workers:
    """Daemon threads running jobs, started as needed: one per job running at once, which
    the heartbeat keeps to one per client. Not a ThreadPoolExecutor: its threads are joined
    at interpreter exit, so a job stuck on a frozen server would hold up the exit."""

    #: Seconds an idle thread waits for a job before it ends.
    IDLE = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # Threads waiting for a job, less the jobs already promised to them by ``submit``.
        self._idle = 0
        self._threads: set[threading.Thread] = set()
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                thread = threading.Thread(
                    target=self._work, name="celery_singleton_lock-renewer", daemon=True
                )
                thread.start()
                self._threads.add(thread)
        self._jobs.put(job)

    def _work(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=self.IDLE)
                except queue.Empty:
                    with self._lock:
                        if self._idle:  # no job is promised to this thread: end it
                            self._idle -= 1
                            return
                    continue
                if job is None:
                    return
                try:
                    job()
                except BaseException:  # as in Heartbeat._run: never die silently
                    log.exception("heartbeat renewal failed")
                with self._lock:
                    if self._closed:
                        return
                    self._idle += 1
        finally:
            with self._lock:
                self._threads.discard(me)

    def shutdown(self, deadline: float) -> None:
        """End the threads; join them until ``deadline`` (monotonic). A job submitted
        afterwards still runs, on a thread of its own."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
            threads = list(self._threads)
        for _ in range(idle):
            self._jobs.put(None)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=max(0.0, deadline - time.monotonic()))


_heartbeat = Heartbeat()


def heartbeat() -> Heartbeat:
    """The process's heartbeat."""
    return _heartbeat


os.register_at_fork(after_in_child=_heartbeat._reset)
atexit.register(_heartbeat.stop)
