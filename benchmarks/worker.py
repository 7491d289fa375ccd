"""Section ``worker``: what a SingletonTask adds to each run, timed inside the worker.

The target: "SingletonTask worker overhead <= 2 Redis round trips + 50 µs of Python per task
(timed inside the worker), and no extra round trip for tasks whose lock is never contended".

A real worker (``celery.contrib.testing.worker.start_worker``, solo pool, in this process)
runs tasks whose bodies are empty, from a pre-filled queue, every call with its own argument
(no lock is ever contended). The broker is the benchmark's Redis; the locks live on a second,
private redis-server (the lock store), so that every command counted there is the lock
layer's own. Variants, each on its own app and queue:

- **plain**: ``@app.task``, the baseline;
- **default**: ``base=SingletonTask`` with the default options;
- **release delay**: ``lock_release_delay=60`` (the key stays locked after the run);
- **lock_on_enqueue**: ``lock_on_enqueue=True`` (claimed in ``apply_async``; the run takes the
  claim over);
- (**no done marks**): the default task with ``singleton_lock_done_mark_ttl=0``, a diagnostic
  row: what the done mark's read and write cost the run;
- (**until_start**): ``lock_on_enqueue="until_start"``, a diagnostic row with no target (its
  queue claim is freed in the acquire's round trip, so it makes two round trips as well).

Per task, in the worker thread (``time.perf_counter_ns``): the ``task_prerun`` receiver (the
last one connected), the body's first and last statement, and the ``task_postrun`` receiver.
*Before* is prerun to body start, *after* body end to postrun (the lock is released in
between); their sum, less the plain task's median, is what the lock layer adds. The lock
client's connections (``singleton_lock_client_kwargs``: ``connection_class``) count their
writes (one write per request or pipeline, so writes = round trips) and time their socket
I/O (the request's write and the wait for and parsing of its reply); *Python* is the added
time less that I/O; *CPU* the worker thread's CPU time (``time.thread_time_ns``) over the
same spans, which leaves out the time the thread waited for a CPU. The lock store's
``INFO commandstats`` (before and after the timed tasks; INFO itself left out) counts the
commands the server ran.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun, task_prerun

from celery_singleton_lock.embedded import RedisServer

from .context import Context
from .registry import section
from .report import Table, verdict
from .stats import median, percentile

TARGET_ROUND_TRIPS = 2
TARGET_PYTHON_US = 50.0
#: Calls each worker runs before the timed ones (connections, scripts, caches).
WARMUP = 50
#: How long a round may take before the benchmark gives up (an error: it never should).
DRAIN_TIMEOUT = 300.0

#: variant -> the SingletonTask options (None: a plain task).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "default": {},
    "release delay": {"lock_release_delay": 60},
    "lock_on_enqueue": {"lock_on_enqueue": True},
    "until_start": {"lock_on_enqueue": "until_start"},
    "no done marks": {},
}
#: variant -> app settings of its own.
SETTINGS: dict[str, dict[str, Any]] = {"no done marks": {"singleton_lock_done_mark_ttl": 0}}
LABELS = {
    "plain": "plain `@app.task`",
    "default": "`SingletonTask`, default options",
    "release delay": "`lock_release_delay=60`",
    "lock_on_enqueue": "`lock_on_enqueue=True`",
    "until_start": '(`lock_on_enqueue="until_start"`)',
    "no done marks": "(default, `singleton_lock_done_mark_ttl=0`)",
}
#: Variants held to the targets (the rest are diagnostics).
TARGETED = ("default", "release delay", "lock_on_enqueue")


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--worker-count", type=int, help="timed tasks per round (300 quick, 1000)")
    group.add_argument("--worker-rounds", type=int, help="rounds per variant (1 quick, 3 full)")
    group.add_argument(
        "--worker-profile",
        action="store_true",
        help="also profile the default SingletonTask's runs in the worker (cProfile) and "
        "print where their time goes",
    )


class Counters(threading.local):
    """The lock clients' writes and I/O nanoseconds, per thread: what the worker thread's runs
    send, apart from the heartbeat thread's renewals."""

    writes = 0
    io_ns = 0


COUNTERS = Counters()


class LockConnection(redis.Connection):
    """The lock clients' connection: counts its writes (a request or a whole pipeline is
    written once, then its replies read, so writes = round trips) and the nanoseconds spent
    writing requests and waiting for and parsing replies."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        started = time.perf_counter_ns()
        try:
            super().send_packed_command(command, check_health)
        finally:
            COUNTERS.io_ns += time.perf_counter_ns() - started
            COUNTERS.writes += 1

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        try:
            return super().read_response(*args, **kwargs)
        finally:
            COUNTERS.io_ns += time.perf_counter_ns() - started


@dataclass
class Samples:
    """Per timed task: nanoseconds, CPU time, lock I/O and lock round trips, before and after
    the body together; per round: server commands per task and round trips per enqueue."""

    before_ns: list[int] = field(default_factory=list)
    after_ns: list[int] = field(default_factory=list)
    cpu_ns: list[int] = field(default_factory=list)  # the worker thread's CPU time, both
    io_ns: list[int] = field(default_factory=list)
    round_trips: list[int] = field(default_factory=list)
    commands: list[float] = field(default_factory=list)  # server-side, per task, per round
    enqueue_round_trips: list[float] = field(default_factory=list)  # per apply_async call

    def total_us(self) -> list[float]:
        return [(b + a) / 1000 for b, a in zip(self.before_ns, self.after_ns, strict=True)]

    def cpu_us(self) -> list[float]:
        return [cpu / 1000 for cpu in self.cpu_ns]

    def python_us(self) -> list[float]:
        return [
            (b + a - io) / 1000
            for b, a, io in zip(self.before_ns, self.after_ns, self.io_ns, strict=True)
        ]


class Recorder:
    """Timestamps one task's runs in the worker thread; only the ``armed`` runs count.

    The mark of each point is (perf_counter_ns, thread_time_ns, lock writes, lock I/O ns),
    taken as the last thing of the prerun receiver and of the body's start, the first of the
    body's end and of the postrun receiver."""

    def __init__(self) -> None:
        self.task_name = ""
        self.count = 0  # timed runs of the round
        self.skip = 0  # runs still to go before the timed ones
        self.left = 0  # timed runs still to go
        self.samples = Samples()
        self.done = threading.Event()
        self.probe: redis.Redis | None = None  # the lock store, for commandstats
        self._stats0: dict[str, int] = {}
        self._marks: list[tuple[int, int, int, int]] = []
        self.profiler: Any = None
        task_prerun.connect(self._prerun, weak=False)
        task_postrun.connect(self._postrun, weak=False)

    def close(self) -> None:
        task_prerun.disconnect(self._prerun)
        task_postrun.disconnect(self._postrun)

    def arm(self, task_name: str, skip: int, count: int, samples: Samples) -> None:
        self.task_name, self.skip, self.left, self.samples = task_name, skip, count, samples
        self.count = count
        self.done.clear()

    @property
    def timing(self) -> bool:
        return self.skip <= 0 and self.left > 0

    @staticmethod
    def mark() -> tuple[int, int, int, int]:
        return (time.perf_counter_ns(), time.thread_time_ns(), COUNTERS.writes, COUNTERS.io_ns)

    def _prerun(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) != self.task_name:
            return
        if self.skip == 0 and self.left > 0 and not self._stats0 and self.probe is not None:
            self._stats0 = command_calls(self.probe)  # before the first timed run
        if self.profiler is not None and self.timing:
            self.profiler.enable()
        self._marks = [self.mark()]

    def body_start(self) -> None:
        if self.timing:
            self._marks.append(self.mark())

    def body_end(self) -> None:
        if self.timing:
            self._marks.append(self.mark())

    def _postrun(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) != self.task_name:
            return
        end = self.mark()
        if self.profiler is not None and self.timing:
            self.profiler.disable()
        if self.skip > 0:
            self.skip -= 1
            return
        if self.left <= 0:
            return
        (t0, c0, w0, io0), (t1, c1, w1, io1), (t2, c2, w2, io2) = self._marks
        t3, c3, w3, io3 = end
        s = self.samples
        s.before_ns.append(t1 - t0)
        s.after_ns.append(t3 - t2)
        s.cpu_ns.append((c1 - c0) + (c3 - c2))
        s.io_ns.append((io1 - io0) + (io3 - io2))
        s.round_trips.append((w1 - w0) + (w3 - w2))
        self.left -= 1
        if self.left == 0:
            if self.probe is not None and self._stats0:
                after = command_calls(self.probe)
                ran = sum(after.values()) - sum(self._stats0.values())
                s.commands.append(ran / self.count)
            self._stats0 = {}
            self.done.set()


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command the server has counted (``INFO commandstats``), INFO left out."""
    stats = client.info("commandstats")
    return {
        name: int(value.get("calls", 0))
        for name, value in stats.items()
        if name != "cmdstat_info" and isinstance(value, dict)
    }


@dataclass
class Variant:
    key: str
    app: Celery
    task: Any


def make_variant(ctx: Context, key: str, lock_url: str, recorder: Recorder) -> Variant:
    prefix = ctx.prefix("worker")
    queue = f"{prefix}{key.replace(' ', '-')}"
    app = Celery(f"bench_{ctx.run_id}_worker_{key.replace(' ', '_')}", set_as_current=False)
    app.conf.update(
        broker_url=ctx.url,
        broker_transport_options={"global_keyprefix": prefix},
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        task_ignore_result=True,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        singleton_lock_url=lock_url,
        singleton_lock_prefix=f"{prefix}csl:",
        singleton_lock_client_kwargs={"connection_class": LockConnection},
        **SETTINGS.get(key, {}),
    )
    options: dict[str, Any] = {"name": f"bench_{ctx.run_id}.worker.{key}", "ignore_result": True}
    extra = VARIANTS[key]
    if extra is not None:
        from celery_singleton_lock import SingletonTask

        options["base"] = SingletonTask
        options.update(extra)
    start, end = recorder.body_start, recorder.body_end

    @app.task(**options)  # type: ignore[untyped-decorator]
    def body(i: int) -> None:
        start()
        end()

    app.finalize()
    return Variant(key, app, body)


def one_round(
    variant: Variant,
    count: int,
    numbers: Iterator[int],
    recorder: Recorder,
    samples: Samples,
    warmup: int = WARMUP,
) -> None:
    send = variant.task.apply_async
    for _ in range(warmup):
        send((next(numbers),))
    calls = [(next(numbers),) for _ in range(count)]
    writes0 = COUNTERS.writes
    for args in calls:
        send(args)
    samples.enqueue_round_trips.append((COUNTERS.writes - writes0) / count)
    recorder.arm(variant.task.name, warmup, count, samples)
    gc.collect()
    with start_worker(
        variant.app,
        pool="solo",
        concurrency=1,
        perform_ping_check=False,
        loglevel="ERROR",
        shutdown_timeout=60.0,
    ):
        if not recorder.done.wait(DRAIN_TIMEOUT):
            raise RuntimeError(f"{variant.key}: the worker did not run {count} tasks in time")


@dataclass
class WorkerResult:
    samples: dict[str, Samples]
    rounds: int
    count: int
    ping_us: float  # a bare PING round trip on the lock store, median
    separate_store: bool
    profile: str = ""


def ping_us(client: redis.Redis, times: int = 200) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter_ns()
        client.ping()
        spent.append((time.perf_counter_ns() - started) / 1000)
    return median(spent)


def measure(
    ctx: Context,
    lock_url: str,
    separate: bool,
    count: int,
    rounds: int,
    profile: bool,
    warmup: int,
) -> WorkerResult:
    recorder = Recorder()
    probe = redis.Redis.from_url(lock_url)
    recorder.probe = probe if separate else None
    variants = [make_variant(ctx, key, lock_url, recorder) for key in VARIANTS]
    numbers = itertools.count()
    samples = {key: Samples() for key in VARIANTS}
    try:
        if warmup:
            # A first, untimed round of each: imports, connections, Lua scripts, code paths.
            for variant in variants:
                one_round(variant, max(20, count // 10), numbers, recorder, Samples(), warmup)
        for i in range(rounds):
            turn = variants[i % len(variants) :] + variants[: i % len(variants)]
            for variant in turn:
                one_round(variant, count, numbers, recorder, samples[variant.key], warmup)
        text = ""
        if profile:
            text = profile_default(variants[1], count, numbers, recorder)
        pinged = ping_us(probe)
    finally:
        from celery_singleton_lock.celery.app_client import close_lock_client

        recorder.close()
        probe.close()
        for variant in variants:
            close_lock_client(variant.app)
    return WorkerResult(samples, rounds, count, pinged, separate, text)


def profile_default(variant: Variant, count: int, numbers: Iterator[int], recorder: Any) -> str:
    """cProfile of the default SingletonTask's runs, from prerun to postrun, in the worker
    thread; the functions with the most cumulative time."""
    import cProfile
    import io
    import pstats

    recorder.profiler = cProfile.Profile()
    try:
        one_round(variant, count, numbers, recorder, Samples())
    finally:
        profiler, recorder.profiler = recorder.profiler, None
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(25)
    return out.getvalue()


def us(value: float) -> str:
    return f"{value:,.1f}"


def overhead_us(s: Samples, base: Samples) -> tuple[float, float]:
    """(added µs, added Python µs) per task: medians less the plain task's medians."""
    return (
        median(s.total_us()) - median(base.total_us()),
        median(s.python_us()) - median(base.python_us()),
    )


def tables(result: WorkerResult) -> list[Table]:
    base = result.samples["plain"]
    out = Table(
        f"SingletonTask overhead inside the worker (solo pool), empty bodies, distinct keys "
        f"({result.rounds} rounds x {result.count} tasks)",
        [
            "task",
            "before body µs",
            "after body µs",
            "added µs",
            "p95 µs",
            "lock I/O µs",
            "added Python µs",
            "p95",
            "added CPU µs",
            "round trips/task",
            "max",
            "server commands/task",
            "enqueue round trips/call",
        ],
        numeric=frozenset(range(1, 13)),
    )
    plain_total = median(base.total_us())
    plain_python = median(base.python_us())
    for key, s in result.samples.items():
        added, python = overhead_us(s, base)
        total, py = s.total_us(), s.python_us()
        out.add(
            LABELS[key],
            us(median([b / 1000 for b in s.before_ns])),
            us(median([a / 1000 for a in s.after_ns])),
            "" if key == "plain" else us(added),
            "" if key == "plain" else us(percentile(total, 95) - plain_total),
            us(median([io / 1000 for io in s.io_ns])),
            "" if key == "plain" else us(python),
            "" if key == "plain" else us(percentile(py, 95) - plain_python),
            "" if key == "plain" else us(median(s.cpu_us()) - median(base.cpu_us())),
            f"{median(s.round_trips):g}",
            f"{max(s.round_trips)}",
            f"{median(s.commands):g}" if s.commands else "",
            f"{median(s.enqueue_round_trips):g}",
        )
    out.notes.append(
        "before: task_prerun to the body's first statement; after: the body's last statement"
        " to task_postrun (the lock is released in between); added: median of before+after"
        " less the plain task's median (p95: the 95th percentile less the plain median)"
    )
    out.notes.append(
        "lock I/O: time the lock client's connections spent writing requests and waiting for"
        " and parsing replies; Python: before+after less that I/O, less the plain task's;"
        f" a bare PING round trip on the lock store took {result.ping_us:.1f} µs (median)"
    )
    out.notes.append(
        "CPU: the worker thread's CPU time before+after (time.thread_time_ns: user and"
        " kernel, the socket calls' included) less the plain task's: what the thread"
        " computed, without the time it waited for Redis or for a CPU (a busy machine)"
    )
    out.notes.append(
        "round trips: the lock client's socket writes from prerun to postrun (a pipeline is"
        " one); server commands: the lock store's INFO commandstats over the timed tasks"
        " (a script counts with the commands it calls)"
        + ("" if result.separate_store else "; not shown: the lock store is the broker's server")
    )
    targets = Table("Targets (inside the worker, uncontended)", ["target", "measured", ""])
    for key in TARGETED:
        s = result.samples[key]
        trips = max(s.round_trips)
        _, python = overhead_us(s, base)
        targets.add(
            f"{key}: <= {TARGET_ROUND_TRIPS} lock round trips per task",
            f"{median(s.round_trips):g} (max {trips})",
            verdict(trips <= TARGET_ROUND_TRIPS),
        )
        targets.add(
            f"{key}: <= {TARGET_PYTHON_US:g} µs of added Python per task",
            f"{python:.1f} µs",
            verdict(python <= TARGET_PYTHON_US),
        )
    return [out, targets]


def lock_store(ctx: Context) -> tuple[str, RedisServer | None]:
    """A redis-server of its own for the locks, so the broker's traffic is not counted;
    the benchmark's server when none can be started."""
    try:
        server = RedisServer()
        server.start()
    except (RuntimeError, OSError) as exc:
        ctx.notes.append(f"worker: no separate lock store ({exc}); locks on the broker's server")
        return ctx.url, None
    return server.url, server


def run_worker(
    ctx: Context, count: int, rounds: int, *, profile: bool = False, warmup: int = WARMUP
) -> WorkerResult:
    """Measure every variant: ``rounds`` rounds of ``count`` timed tasks, each after
    ``warmup`` untimed ones (0: no warm-up, and no untimed first round either)."""
    logging.getLogger("celery").setLevel(logging.ERROR)
    url, server = lock_store(ctx)
    try:
        return measure(ctx, url, server is not None, count, rounds, profile, warmup)
    finally:
        if server is not None:
            server.close()


@section(
    "worker",
    "SingletonTask overhead timed inside the worker",
    add_arguments=add_arguments,
    order=45,
)
def run(ctx: Context) -> list[Table]:
    count = ctx.pick("worker_count", 300, 1000)
    rounds = ctx.pick("worker_rounds", 1, 3)
    profile = bool(getattr(ctx.options, "worker_profile", False))
    result = run_worker(ctx, count, rounds, profile=profile)
    if result.profile:
        print("\ncProfile of the default SingletonTask's runs (prerun to postrun):")
        print(result.profile, flush=True)
    return tables(result)
