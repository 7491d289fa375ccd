"""Section ``memory``: what one finished use of a lock leaves in Redis, and for how long.

The measurement of issue 35 ("Redis memory per call"). Every row makes N uses of one kind of
lock, each on a name of its own (as a ``SingletonTask`` with its arguments in its key makes
them), one after the other. Right after each use ends, every lock key (ours under the lock
prefix, the anchors' by their own naming) is found (SCAN), weighed (``MEMORY USAGE key
SAMPLES 0``), aged (``PTTL``, counted from the use's end) and deleted (leftovers.py), so
each use finds only its own keys. A use's *byte-seconds* are the sum over those keys of
bytes x seconds left; at a steady rate of r distinct uses a second, Redis holds r x that
many bytes of them (Little's law).

Rows:

- every hold kind of ours, default options, a new handle per use: ``with client.lease(n)``,
  ``rwlock(n).read()/.upgradable()/.write()``, ``range_lock(n).read/.write(0, 99)``,
  ``multi([n-a, n-b])``, ``semaphore(n, 3).permit()``;
- a ``SingletonTask`` call run by a real worker (``start_worker``, solo pool, in this
  process): default options, ``acks_late=True``, ``lock_on_enqueue=True``; a call's end is
  its ``task_postrun`` (our release and done mark are written before it);
- the anchors, each used as its docs show (a new lock object per use): redis-py ``Lock``,
  python-redis-lock, celery-singleton (``Singleton``) and celery-once (``QueueOnce``), the
  last two run by the worker as ours.

The tasks' broker and result keys live under prefixes of their own, out of the figures; the
result backend's key of each call is weighed apart (the context table).
"""

from __future__ import annotations

import argparse
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
import redis_lock  # type: ignore[import-untyped]
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.keys import DEFAULT_PREFIX
from celery_singleton_lock.core.layout import layout_key

from .context import Context
from .leftovers import KeyLeft, glob, no_expiry, weigh
from .registry import section
from .report import Table, verdict
from .stats import median

#: Issue 35's targets, byte-seconds per use after release.
TARGET_HOLD = 0.02e6
TARGET_TASK = 0.05e6
#: Rates of distinct uses a second at which the steady state is shown.
RATES = (100, 1000)
#: The anchors' lock timeout (ours' default ttl): their keys go at release anyway.
ANCHOR_TTL = 30
#: How long one task call may take from send to ``task_postrun`` (an error: it never should).
CALL_TIMEOUT = 30.0

#: One use of a hold kind: (our client, the use's name).
OurUse = Callable[[LockClient, str], None]
#: One use of an anchor's lock: (redis client, the use's key).
AnchorUse = Callable[[redis.Redis, str], None]


def use_lease(client: LockClient, name: str) -> None:
    with client.lease(name):
        pass


def use_read(client: LockClient, name: str) -> None:
    with client.rwlock(name).read():
        pass


def use_upgradable(client: LockClient, name: str) -> None:
    with client.rwlock(name).upgradable():
        pass


def use_write(client: LockClient, name: str) -> None:
    with client.rwlock(name).write():
        pass


def use_range_read(client: LockClient, name: str) -> None:
    with client.range_lock(name).read(0, 99):
        pass


def use_range_write(client: LockClient, name: str) -> None:
    with client.range_lock(name).write(0, 99):
        pass


def use_multi(client: LockClient, name: str) -> None:
    with client.multi([f"{name}-a", f"{name}-b"]):
        pass


def use_permit(client: LockClient, name: str) -> None:
    with client.semaphore(name, 3).permit():
        pass


def use_redis_py(client: redis.Redis, key: str) -> None:
    with client.lock(key, timeout=ANCHOR_TTL):
        pass


def use_python_redis_lock(client: redis.Redis, key: str) -> None:
    with redis_lock.Lock(client, key, expire=ANCHOR_TTL):
        pass


#: row key -> (label, use); labels are what the smoke test looks for.
OUR_HOLDS: dict[str, tuple[str, OurUse]] = {
    "lease": ("**ours** lease (`with client.lease(n)`)", use_lease),
    "read": ("**ours** read (`rwlock(n).read()`)", use_read),
    "upgradable": ("**ours** upgradable (`rwlock(n).upgradable()`)", use_upgradable),
    "write": ("**ours** write (`rwlock(n).write()`)", use_write),
    "range-read": ("**ours** range read (`range_lock(n).read(0, 99)`)", use_range_read),
    "range-write": ("**ours** range write (`range_lock(n).write(0, 99)`)", use_range_write),
    "multi": ("**ours** multi-key, 2 names (`multi([a, b])`)", use_multi),
    "permit": ("**ours** semaphore permit (`semaphore(n, 3).permit()`)", use_permit),
}
ANCHOR_HOLDS: dict[str, tuple[str, AnchorUse]] = {
    "redis-py": ("redis-py `Lock` (`with client.lock(k)`)", use_redis_py),
    "python-redis-lock": ("python-redis-lock `redis_lock.Lock`", use_python_redis_lock),
}
#: row key -> (label, the SingletonTask's options); the anchors' bases: ``make_task_app``.
OUR_TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "task": ("**ours** `SingletonTask` call, default options", {}),
    "task-acks-late": ("**ours** `SingletonTask` call, `acks_late=True`", {"acks_late": True}),
    "task-on-enqueue": (
        "**ours** `SingletonTask` call, `lock_on_enqueue=True`",
        {"lock_on_enqueue": True},
    ),
}
ANCHOR_TASKS: dict[str, str] = {
    "celery-singleton": "celery-singleton `Singleton` call",
    "celery-once": "celery-once `QueueOnce` call",
}
#: Every row's label, ours first: what the smoke test expects a row of.
LABELS: dict[str, str] = {
    **{key: label for key, (label, _) in OUR_HOLDS.items()},
    **{key: label for key, (label, _) in OUR_TASKS.items()},
    **{key: label for key, (label, _) in ANCHOR_HOLDS.items()},
    **ANCHOR_TASKS,
}


#: Rows whose first use's key names the table shows.
EXAMPLES = ("lease", "task-on-enqueue", "python-redis-lock")
#: What each kind of key of ours is kept for, and what bounds its life (docs/lease.md,
#: docs/locks.md, docs/tasks.md, docs/fencing.md).
PURPOSES = {
    "fencing counter": "the name's last token, for a token in the same µs or after a clock"
    " step back; until the clock passes it, + 10 s",
    "release trace": "the freed hold's owner and token, for a release re-sent after a lost"
    " reply; the hold's time left",
    "done mark": "drops a copy of a finished call's message (only where one can come);"
    " 2 visibility timeouts",
    "undo record": "puts back the claim an acquire took over, if its reply was lost;"
    " the claim's time left",
}


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--memory-uses", type=int, help="uses per row (20 quick, 200 full)")


@dataclass
class Row:
    """What every use of one row left: its lock keys, and (tasks) its result key."""

    key: str
    uses: list[list[KeyLeft]] = field(default_factory=list)
    results: list[list[KeyLeft]] = field(default_factory=list)


def lock_prefix(ctx: Context) -> str:
    """The prefix of every counted key. On the throwaway server our default, ``csl:``, so
    that key names, and so the bytes, are a deployment's; on a shared ``$REDIS_URL`` the
    run's own prefix, by which the run's clean-up finds them (keys there are ~25 bytes
    longer). Rows need no prefix of their own: each use's keys are deleted once weighed."""
    return DEFAULT_PREFIX if ctx.embedded else ctx.prefix("memory")


def use_name(i: int) -> str:
    """The name of use ``i``: the name a ``SingletonTask`` gives its call (its name and
    arguments as JSON), so its keys are as long as a task call's (the braces make the hash
    tag a digest). The same in every row (a use's keys are gone before the next use), so
    the rows differ by their kind of lock alone, not by names one byte longer."""
    return f'tasks.sync_account:{{"account_id":{100000 + i}}}'


def measure_our_hold(ctx: Context, key: str, use: OurUse, count: int) -> Row:
    prefix = lock_prefix(ctx)
    probe = ctx.redis()
    client = LockClient(ctx.redis(), prefix=prefix)
    row = Row(key)
    try:
        for i in range(count):
            use(client, use_name(i))
            # The lock's keys (in its hash tag): not the prefix's key layout record, which
            # the first use writes and no use adds to.
            row.uses.append(weigh(probe, glob(prefix) + "{*", time.monotonic()))
    finally:
        client.close()
        probe.delete(layout_key(prefix))  # the next row finds the prefix as this one did
        probe.close()
    return row


def measure_anchor_hold(ctx: Context, key: str, use: AnchorUse, count: int) -> Row:
    prefix = lock_prefix(ctx)
    client = ctx.redis()
    row = Row(key)
    try:
        for i in range(count):
            use(client, prefix + use_name(i))
            # python-redis-lock puts its own prefixes ("lock:", "lock-signal:") first.
            row.uses.append(weigh(client, f"*{glob(prefix)}*", time.monotonic()))
    finally:
        client.close()
    return row


class Ends:
    """When each task call ended (``task_postrun``, in the worker's thread), by task id."""

    def __init__(self) -> None:
        self._ended: dict[str, float] = {}
        self._changed = threading.Condition()
        task_postrun.connect(self._on_end, weak=False)

    def _on_end(self, task_id: str | None = None, **_: Any) -> None:
        ended = time.monotonic()
        with self._changed:
            self._ended[str(task_id)] = ended
            self._changed.notify_all()

    def wait(self, task_id: str, timeout: float) -> float:
        """``time.monotonic()`` at the end of call ``task_id``, once it has ended."""
        with self._changed:
            if not self._changed.wait_for(lambda: task_id in self._ended, timeout):
                raise RuntimeError(f"task {task_id} did not end within {timeout} s")
            return self._ended.pop(task_id)

    def close(self) -> None:
        task_postrun.disconnect(self._on_end)


@dataclass
class TaskApp:
    app: Celery
    task: Any
    lock_pattern: str  # the keys of its locks
    result_pattern: str  # the result backend's keys


def make_task_app(ctx: Context, key: str) -> TaskApp:
    """An app of its own for row ``key``, its broker, result and lock keys under three
    distinct prefixes, so that only the lock keys are counted."""
    locks = lock_prefix(ctx)
    # Neither contains ``locks``: no lock pattern matches them.
    results = f"{ctx.prefix('memory-results')}{key}:"
    broker = f"{ctx.prefix('memory-broker')}{key}:"
    # celery-once names its keys after the task: the run id in them when they must be found.
    name = f"tasks.{key.replace('-', '_')}"
    if not ctx.embedded:
        name = f"bench_{ctx.run_id}.{name}"
    app = Celery(f"bench_{ctx.run_id}_memory_{key}", set_as_current=False)
    app.conf.update(
        broker_url=ctx.url,
        broker_transport_options={"global_keyprefix": broker},
        broker_connection_retry_on_startup=True,
        result_backend=ctx.url,
        result_backend_transport_options={"global_keyprefix": results},
        task_default_queue=broker.rstrip(":"),
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        singleton_lock_url=ctx.url,
        singleton_lock_prefix=locks,
        singleton_backend_url=ctx.url,
        singleton_key_prefix=locks,
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": ctx.url, "default_timeout": 3600},
        },
    )
    options: dict[str, Any] = {"name": name}
    lock_pattern = glob(locks) + "*"
    if key in OUR_TASKS:
        from celery_singleton_lock import SingletonTask

        options["base"] = SingletonTask
        options.update(OUR_TASKS[key][1])
        lock_pattern = glob(locks) + "{*"  # not the prefix's key layout record, as above
    elif key == "celery-singleton":
        from celery_singleton import Singleton  # type: ignore[import-untyped]

        options["base"] = Singleton
    elif key == "celery-once":
        from celery_once import QueueOnce  # type: ignore[import-untyped]

        options["base"] = QueueOnce
        lock_pattern = f"qo_{glob(name)}_*"

    @app.task(**options)  # type: ignore[untyped-decorator]
    def body(account_id: int) -> int:
        return account_id

    app.finalize()
    return TaskApp(app, body, lock_pattern, glob(results) + "*")


@contextmanager
def worker(app: Celery) -> Iterator[None]:
    with start_worker(
        app,
        pool="solo",
        concurrency=1,
        perform_ping_check=False,
        loglevel="ERROR",
        shutdown_timeout=60.0,
    ):
        yield


def measure_task(ctx: Context, key: str, count: int, ends: Ends) -> Row:
    """``count`` calls of row ``key``'s task, each sent once the last one has ended."""
    from celery_singleton_lock.celery.app_client import close_lock_client

    made = make_task_app(ctx, key)
    probe = ctx.redis()
    row = Row(key)
    try:
        with worker(made.app):
            for i in range(count):
                task_id = made.task.apply_async((100000 + i,)).id
                ended = ends.wait(task_id, CALL_TIMEOUT)
                row.uses.append(weigh(probe, made.lock_pattern, ended))
                row.results.append(weigh(probe, made.result_pattern, ended))
    finally:
        close_lock_client(made.app)
        probe.delete(layout_key(lock_prefix(ctx)))  # ours wrote it; the next row meets none
        probe.close()
    return row


# Formatting -------------------------------------------------------------------------------


def seconds(value: float) -> str:
    if math.isinf(value):
        return "never"
    if value >= 100:
        return f"{value:,.0f} s"
    return f"{value:.1f} s"


def mb_s(byte_seconds: float) -> str:
    """Byte-seconds in MB·s (MB = 10^6 bytes)."""
    if math.isinf(byte_seconds):
        return "NO EXPIRY"
    value = byte_seconds / 1e6
    if value == 0:
        return "0"
    if value < 0.001:
        return f"{value:.1g}"
    return f"{value:.3f}"


def mb(held: float) -> str:
    if math.isinf(held):
        return "unbounded"
    value = held / 1e6
    if value == 0:
        return "0"
    if value < 0.1:
        return f"{value:.2g} MB"
    return f"{value:,.1f} MB"


def kinds(uses: Sequence[Sequence[KeyLeft]]) -> str:
    """The kinds of key the uses left, how many a use (when not one) and how long they live
    (median), most long-lived first."""
    counts = Counter(key.kind for use in uses for key in use)
    if not counts:
        return "–"
    lives = {
        kind: median([key.left_s for use in uses for key in use if key.kind == kind])
        for kind in counts
    }
    parts = []
    for kind in sorted(counts, key=lambda k: -lives[k]):
        per_use = counts[kind] / len(uses)
        times = "" if per_use == 1 else f" ×{per_use:g}"
        parts.append(f"{kind}{times} ({seconds(lives[kind])})")
    return ", ".join(parts)


@dataclass(frozen=True)
class Figures:
    """One row's medians per use."""

    keys: float
    bytes: float
    max_left: float
    byte_seconds: float

    @classmethod
    def of(cls, uses: Sequence[Sequence[KeyLeft]]) -> Figures:
        return cls(
            keys=median([len(use) for use in uses]),
            bytes=median([sum(key.bytes for key in use) for use in uses]),
            max_left=median([max((key.left_s for key in use), default=0.0) for use in uses]),
            byte_seconds=median([sum(key.byte_seconds for key in use) for use in uses]),
        )


def figures_table(rows: dict[str, Row], count: int) -> Table:
    out = Table(
        f"What one finished use leaves in Redis, distinct names (median of {count} uses)",
        [
            "one use of",
            "keys left",
            "kinds (seconds left)",
            "bytes",
            "seconds left (max)",
            "MB·s per use",
            *(f"held at {rate:,}/s" for rate in RATES),
        ],
        numeric=frozenset({1, 3, 4, 5, 6, 7}),
    )
    for key, row in rows.items():
        f = Figures.of(row.uses)
        out.add(
            LABELS[key],
            f"{f.keys:g}",
            kinds(row.uses),
            f"{f.bytes:,.0f}",
            seconds(f.max_left) if f.keys else "–",
            mb_s(f.byte_seconds),
            *(mb(f.byte_seconds * rate) for rate in RATES),
        )
        forever = no_expiry(row.uses)
        if forever:
            out.notes.append(
                f"FAIL: {LABELS[key]} left {forever} key(s) with NO EXPIRY over {count} uses"
            )
    out.notes.append(
        "after each use, every lock key it left: MEMORY USAGE key SAMPLES 0 (bytes)"
        " and PTTL counted from the use's end (seconds left); MB·s per use: the sum of bytes x"
        " seconds left over the use's keys (MB = 10^6 bytes); held at r/s: r x MB·s per use,"
        " what a steady r distinct uses a second keep in Redis"
    )
    out.notes.append(
        "tasks: a real worker (solo pool, in-process), one call at a time, each with its own"
        " argument; only the lock keys are counted (broker and result keys live under other"
        " prefixes); a call ends at its task_postrun"
    )
    for key in EXAMPLES:
        if key in rows and rows[key].uses:
            names = ", ".join(f"`{k.name}`" for k in rows[key].uses[0])
            out.notes.append(f"the keys of one use, {LABELS[key]}: {names or 'none'}")
    return out


def kinds_table(rows: dict[str, Row]) -> Table:
    """Where ours' byte-seconds go: every kind of key our rows left, weighed per key."""
    out = Table(
        "Ours, by kind of key left (per key)",
        ["kind of key", "rows", "bytes", "seconds left", "MB·s per key", "kept for"],
        numeric=frozenset({1, 2, 3, 4}),
    )
    per_row: dict[str, dict[str, list[KeyLeft]]] = {}
    for key, row in rows.items():
        if key in OUR_HOLDS or key in OUR_TASKS:
            for use in row.uses:
                for left in use:
                    per_row.setdefault(left.kind, {}).setdefault(key, []).append(left)

    def per_life(by_row: dict[str, list[KeyLeft]]) -> list[float]:
        return [median([k.left_s for k in keys]) for keys in by_row.values()]

    def spread(values: list[float], show: Callable[[float], str]) -> str:
        low, high = show(min(values)), show(max(values))
        return low if low == high else f"{low}–{high}"

    # The kinds most rows leave first, then the longest-lived.
    order = sorted(per_row, key=lambda k: (-len(per_row[k]), -max(per_life(per_row[k]))))
    for kind in order:
        by_row = per_row[kind]
        sizes = [median([k.bytes for k in keys]) for keys in by_row.values()]
        lives = per_life(by_row)
        costs = [median([k.byte_seconds for k in keys]) for keys in by_row.values()]
        out.add(
            kind,
            f"{len(by_row)}",
            spread(sizes, lambda v: f"{v:,.0f}"),
            spread(lives, seconds),
            spread(costs, mb_s),
            PURPOSES.get(kind, ""),
        )
    out.notes.append(
        "bytes, seconds left and MB·s: the median key of each row, from the least to the most"
        " among the rows that leave that kind"
    )
    return out


def results_table(rows: dict[str, Row]) -> Table:
    out = Table(
        "For context, not counted above: the result backend's key per task call",
        ["task call", "keys", "bytes", "seconds left", "MB·s per call"],
        numeric=frozenset({1, 2, 3, 4}),
    )
    for key, row in rows.items():
        if row.results:
            f = Figures.of(row.results)
            out.add(
                LABELS[key],
                f"{f.keys:g}",
                f"{f.bytes:,.0f}",
                seconds(f.max_left),
                mb_s(f.byte_seconds),
            )
    out.notes.append(
        "celery-task-meta-<id>, Celery's result_expires default (1 day); a task with"
        " ignore_result=True leaves none"
    )
    return out


def targets_table(rows: dict[str, Row]) -> Table:
    out = Table("Targets (issue 35)", ["target", "measured", ""])
    holds = {key: Figures.of(rows[key].uses).byte_seconds for key in OUR_HOLDS if key in rows}
    if holds:
        worst = max(holds, key=lambda k: holds[k])
        out.add(
            f"every hold kind of ours: <= {mb_s(TARGET_HOLD)} MB·s per use",
            f"{mb_s(holds[worst])} MB·s ({worst})",
            verdict(holds[worst] <= TARGET_HOLD),
        )
    if "task" in rows:
        task = Figures.of(rows["task"].uses).byte_seconds
        out.add(
            f"SingletonTask call, default options: <= {mb_s(TARGET_TASK)} MB·s",
            f"{mb_s(task)} MB·s",
            verdict(task <= TARGET_TASK),
        )
    forever = sum(no_expiry(rows[key].uses) for key in rows if key in OUR_HOLDS or key in OUR_TASKS)
    out.add("no key of ours left without an expiry", f"{forever} keys", verdict(forever == 0))
    return out


@section("memory", "Redis memory after release", add_arguments=add_arguments, order=50)
def run(ctx: Context) -> list[Table]:
    count = ctx.pick("memory_uses", 20, 200)
    logging.getLogger("celery").setLevel(logging.ERROR)
    rows: dict[str, Row] = {}
    for key, (_, our_use) in OUR_HOLDS.items():
        rows[key] = measure_our_hold(ctx, key, our_use, count)
    ends = Ends()
    try:
        for key in OUR_TASKS:
            rows[key] = measure_task(ctx, key, count, ends)
        for key, (_, anchor_use) in ANCHOR_HOLDS.items():
            rows[key] = measure_anchor_hold(ctx, key, anchor_use, count)
        for key in ANCHOR_TASKS:
            rows[key] = measure_task(ctx, key, count, ends)
    finally:
        ends.close()
    return [
        figures_table(rows, count),
        kinds_table(rows),
        results_table(rows),
        targets_table(rows),
    ]
