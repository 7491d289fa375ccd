"""Section ``tasks``: Celery task throughput on a real worker, distinct keys (no conflicts).

Four variants of one trivial task, each on its own app and queue, on the benchmark's Redis
(broker and locks):

- **plain**: ``@app.task`` with no lock, the baseline;
- **ours**: ``@app.task(base=SingletonTask)`` with the default options (key: task name +
  arguments); the lock is taken in the worker, right before the body;
- **celery-singleton**: ``base=Singleton``; it locks in ``apply_async`` (producer side) and
  unlocks in the worker when the task ends;
- **celery-once**: ``base=QueueOnce``; it locks in ``apply_async`` too and unlocks in the
  worker's ``after_return``.

Every call gets its own argument, so no two calls share a key. Each round and variant:
the producer sends a few warm-up calls, then N timed ``apply_async`` calls (the enqueue
time); then a worker (in this process, ``celery.contrib.testing.worker.start_worker``) is
started on the pre-filled queue, and the drain time runs from the start (``task_prerun``) of
the first timed task to the end (``task_postrun``) of the last: no producer runs meanwhile
and worker start-up is not counted, so it is worker-side cost alone. Results are ignored
(no result backend). The variants take turns within each round; figures are medians over
rounds, ratios medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun, task_prerun

from .context import Context
from .registry import section
from .report import Table, verdict
from .stats import median

TARGET_OVERHEAD_MS = 1.0
TARGET_RATIO = 0.9
#: Calls each worker runs before the timed ones (connections, scripts, caches).
WARMUP = 50
#: How long a drain may take before the benchmark gives up (an error: it never should).
DRAIN_TIMEOUT = 300.0

#: Where each variant takes its lock and where it lets go.
LOCK_AT = {
    "plain": "no lock",
    "ours": "worker, before the body; released after it",
    "celery-singleton": "producer (apply_async); released in the worker",
    "celery-once": "producer (apply_async); released in the worker",
}
LABELS = {
    "plain": "plain `@app.task`",
    "ours": "**ours** `SingletonTask`",
    "celery-singleton": "celery-singleton `Singleton`",
    "celery-once": "celery-once `QueueOnce`",
}


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--task-count", type=int, help="timed tasks per round (300 quick, 2000)")
    group.add_argument("--task-rounds", type=int, help="rounds per variant (2 quick, 5 full)")
    group.add_argument(
        "--task-pools",
        default=None,
        help="worker pools, comma-separated: solo, prefork (default: both; quick: solo)",
    )


class Meter:
    """Counts task starts and ends in shared memory, so that prefork children (forked from
    this process) report to it too; remembers when the first timed task started and the last
    one ended (``time.monotonic``, one clock for every process)."""

    def __init__(self) -> None:
        self._lock = multiprocessing.Lock()
        self._counts = multiprocessing.RawArray(ctypes.c_long, 2)  # starts, ends
        self._times = multiprocessing.RawArray(ctypes.c_double, 2)  # first start, last end
        self.first = 0  # the start number of the first timed task
        self.last = 0  # the end number of the last one
        task_prerun.connect(self._on_start, weak=False)
        task_postrun.connect(self._on_end, weak=False)

    def arm(self, skip: int, count: int) -> None:
        with self._lock:
            self._counts[0] = self._counts[1] = 0
            self._times[0] = self._times[1] = 0.0
            self.first, self.last = skip + 1, skip + count

    def _on_start(self, **_: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._counts[0] += 1
            if self._counts[0] == self.first:
                self._times[0] = now

    def _on_end(self, **_: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._counts[1] += 1
            if self._counts[1] == self.last:
                self._times[1] = now

    def wait(self, timeout: float) -> float:
        """Seconds from the first timed start to the last end, once the last has ended."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                ended, started, done = self._counts[1], self._times[0], self._times[1]
            if ended >= self.last and done:
                return done - started
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker ran {ended} of {self.last} tasks in {timeout} s")
            time.sleep(0.005)

    def close(self) -> None:
        task_prerun.disconnect(self._on_start)
        task_postrun.disconnect(self._on_end)


@dataclass
class Variant:
    key: str
    app: Celery
    task: Any


@dataclass
class Rates:
    enqueue: list[float] = field(default_factory=list)  # apply_async calls/s
    worker: list[float] = field(default_factory=list)  # tasks/s


def make_variant(ctx: Context, key: str) -> Variant:
    """A fresh app with its own queue and one trivial task of the variant ``key``."""
    prefix = ctx.prefix("tasks")
    queue = f"{prefix}{key}"
    app = Celery(f"bench_{ctx.run_id}_{key}", set_as_current=False)
    app.conf.update(
        broker_url=ctx.url,
        # Every broker key (queue, unacked, bindings) carries the run id: deleted at the end.
        broker_transport_options={"global_keyprefix": prefix},
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        task_ignore_result=True,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        singleton_lock_url=ctx.url,
        singleton_lock_prefix=f"{prefix}csl:",
        singleton_backend_url=ctx.url,
        singleton_key_prefix=f"{prefix}singleton:",
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": ctx.url, "default_timeout": 3600},
        },
    )
    options: dict[str, Any] = {"name": f"bench_{ctx.run_id}.{key}", "ignore_result": True}
    if key == "ours":
        from celery_singleton_lock import SingletonTask

        options["base"] = SingletonTask
    elif key == "celery-singleton":
        from celery_singleton import Singleton  # type: ignore[import-untyped]

        options["base"] = Singleton
    elif key == "celery-once":
        from celery_once import QueueOnce  # type: ignore[import-untyped]

        options["base"] = QueueOnce

    @app.task(**options)  # type: ignore[untyped-decorator]
    def body(i: int) -> None:
        return None

    app.finalize()
    return Variant(key, app, body)


@contextmanager
def worker(app: Celery, pool: str) -> Iterator[None]:
    concurrency = 1 if pool == "solo" else 2
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="ERROR",
        shutdown_timeout=60.0,
    ):
        yield


def one_round(
    variant: Variant, pool: str, count: int, numbers: Iterator[int], meter: Meter
) -> tuple[float, float]:
    """(apply_async calls/s, worker tasks/s) of one round."""
    send: Callable[..., Any] = variant.task.apply_async
    for _ in range(WARMUP):
        send((next(numbers),))
    calls = [(next(numbers),) for _ in range(count)]
    gc.collect()
    started = time.perf_counter()
    for args in calls:
        send(args)
    enqueue = count / (time.perf_counter() - started)
    meter.arm(WARMUP, count)
    with worker(variant.app, pool):
        drained = meter.wait(DRAIN_TIMEOUT)
    return enqueue, count / drained


def measure(
    variants: list[Variant], pool: str, rounds: int, count: int, numbers: Iterator[int]
) -> dict[str, Rates]:
    meter = Meter()
    rates = {v.key: Rates() for v in variants}
    try:
        # A first, untimed round of each: imports, connections, Lua scripts, code paths.
        for variant in variants:
            one_round(variant, pool, max(50, count // 10), numbers, meter)
        for i in range(rounds):
            turn = variants[i % len(variants) :] + variants[: i % len(variants)]
            for variant in turn:
                enqueue, drain = one_round(variant, pool, count, numbers, meter)
                rates[variant.key].enqueue.append(enqueue)
                rates[variant.key].worker.append(drain)
    finally:
        meter.close()
    return rates


def per_round(values: list[float], base: list[float], f: Callable[[float, float], float]) -> float:
    return median([f(v, b) for v, b in zip(values, base, strict=True)])


def ratio(v: float, b: float) -> float:
    return v / b


def extra_ms(v: float, b: float) -> float:
    return 1000 / v - 1000 / b


def table(pool: str, rates: dict[str, Rates], rounds: int, count: int) -> Table:
    workers = "solo pool" if pool == "solo" else "prefork pool, 2 processes"
    out = Table(
        f"Celery task throughput, one worker ({workers}), distinct keys "
        f"(median of {rounds} rounds x {count} tasks)",
        [
            "task",
            "lock taken in",
            "worker tasks/s",
            "x plain",
            "worker +ms/task",
            "enqueue calls/s",
            "x plain",
            "enqueue +ms/task",
        ],
        numeric=frozenset({2, 3, 4, 5, 6, 7}),
    )
    base = rates["plain"]
    for key, r in rates.items():
        out.add(
            LABELS[key],
            LOCK_AT[key],
            f"{median(r.worker):,.0f}",
            f"{per_round(r.worker, base.worker, ratio):.2f}",
            "" if key == "plain" else f"{per_round(r.worker, base.worker, extra_ms):+.3f}",
            f"{median(r.enqueue):,.0f}",
            f"{per_round(r.enqueue, base.enqueue, ratio):.2f}",
            "" if key == "plain" else f"{per_round(r.enqueue, base.enqueue, extra_ms):+.3f}",
        )
    out.notes.append(
        "worker: from the first timed task's start (task_prerun) to the last one's end"
        " (task_postrun), the queue pre-filled before the worker started; enqueue: N"
        " apply_async calls in a row, no worker running"
    )
    out.notes.append(
        "+ms/task: median over rounds of 1/rate - 1/(plain's rate in the same round);"
        " celery-singleton and celery-once lock at enqueue, so part of their cost is in the"
        " enqueue columns, ours is all on the worker side"
    )
    return out


@section("tasks", "Celery task throughput on a real worker", add_arguments=add_arguments, order=40)
def run(ctx: Context) -> list[Table]:
    count = ctx.pick("task_count", 300, 2000)
    rounds = ctx.pick("task_rounds", 2, 5)
    pools_option = ctx.options.task_pools or ("solo" if ctx.quick else "solo,prefork")
    pools = [p.strip() for p in pools_option.split(",") if p.strip()]
    logging.getLogger("celery").setLevel(logging.ERROR)
    variants = [make_variant(ctx, key) for key in LOCK_AT]
    numbers = itertools.count()
    tables: list[Table] = []
    results: dict[str, dict[str, Rates]] = {}
    for pool in pools:
        results[pool] = measure(variants, pool, rounds, count, numbers)
        tables.append(table(pool, results[pool], rounds, count))

    targets = Table("Targets (ours against plain, worker side)", ["target", "measured", ""])
    for pool, rates in results.items():
        overhead = per_round(rates["ours"].worker, rates["plain"].worker, extra_ms)
        times = per_round(rates["ours"].worker, rates["plain"].worker, ratio)
        targets.add(
            f"{pool}: overhead <= {TARGET_OVERHEAD_MS:g} ms per task",
            f"{overhead:.3f} ms",
            verdict(overhead <= TARGET_OVERHEAD_MS),
        )
        targets.add(
            f"{pool}: throughput >= {TARGET_RATIO}x plain",
            f"{times:.2f}x",
            verdict(times >= TARGET_RATIO),
        )
    tables.append(targets)
    return tables
