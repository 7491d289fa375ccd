"""Prometheus metrics from this package's signals (install the ``prometheus`` extra).

    from celery_singleton_lock.celery.prometheus import register_metrics

    register_metrics()              # into prometheus_client's default registry

Every metric has the label ``task`` (the task name). Lock names are not labels: with the
default key there is one per argument set, and a label per lock would grow without bound.

- ``celery_singleton_lock_acquired_total``: runs that took their lock;
- ``celery_singleton_lock_skipped_total``: runs skipped because their lock was taken;
- ``celery_singleton_lock_lost_total``: runs whose lock was found lost while they ran;
- ``celery_singleton_lock_released_total``: runs that released their lock (or handed it to
  their retry);
- ``celery_singleton_lock_wait_seconds``: a histogram of how long runs waited for their
  lock, with the label ``outcome`` (``acquired`` or ``skipped``).

The signals are sent in the process that runs the task: under the prefork pool, a child.
Use prometheus_client's multiprocess mode there (docs/monitoring.md).

What is held now is read from Redis at each scrape, in the one process that serves them:

    register_lock_states(app)       # or a LockClient; and a registry

- ``celery_singleton_lock_holders``: holders by ``kind`` and ``state`` (live, stale, queued,
  the admin listing's states), as ``celery -A proj locks list`` shows them; every kind and
  state has a sample, 0 when none is held, so a panel or an alert reads 0, not "No data";
- ``celery_singleton_lock_listing_up``: 1 if the last scrape could read the locks, else 0.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..admin.inspect import KINDS, STATES
from ..client import LockClient
from ..exceptions import LockBackendError
from .app_client import lock_client_for
from .signals import lock_acquired, lock_lost, lock_released, lock_skipped

#: Buckets of the wait histogram, in seconds: most runs do not wait; ``lock_wait`` is
#: usually seconds to minutes.
WAIT_BUCKETS = (0.005, 0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0, float("inf"))

_registered: weakref.WeakKeyDictionary[CollectorRegistry, LockMetrics] = weakref.WeakKeyDictionary()
_registering = threading.Lock()


#: The counters, one per signal: (signal, the counter's attribute and name suffix, help).
COUNTED = (
    (lock_acquired, "acquired", "Task runs that took their lock."),
    (lock_skipped, "skipped", "Task runs skipped because their lock was taken."),
    (lock_lost, "lost", "Task runs whose lock was found lost while they ran."),
    (
        lock_released,
        "released",
        "Task runs that released their lock (or handed it to their retry).",
    ),
)


class LockMetrics:
    """The lock metrics in one registry, and the signal receivers that update them."""

    # Set from COUNTED; declared for the type checker.
    acquired: Counter
    skipped: Counter
    lost: Counter
    released: Counter

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._receivers = []
        for signal, outcome, doc in COUNTED:
            counter = Counter(f"celery_singleton_lock_{outcome}", doc, ["task"], registry=registry)
            setattr(self, outcome, counter)
            self._receivers.append((signal, self._receiver(counter, outcome)))
        self.wait = Histogram(
            "celery_singleton_lock_wait_seconds",
            "Seconds task runs waited for their lock.",
            ["task", "outcome"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)

    def _receiver(self, counter: Counter, outcome: str) -> Callable[..., None]:
        def count(sender: Any, wait: float | None = None, **_: Any) -> None:
            counter.labels(task=sender.name).inc()
            if wait is not None:  # sent with lock_acquired and lock_skipped only
                self.wait.labels(task=sender.name, outcome=outcome).observe(wait)

        return count

    def close(self) -> None:
        """Stop counting and take the metrics out of the registry."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        for _, outcome, _ in COUNTED:
            self.registry.unregister(getattr(self, outcome))
        self.registry.unregister(self.wait)
        with _registering:
            if _registered.get(self.registry) is self:
                del _registered[self.registry]


def register_metrics(registry: CollectorRegistry | None = None) -> LockMetrics:
    """Create the lock metrics in ``registry`` (default: prometheus_client's ``REGISTRY``)
    and start updating them from this package's signals. Calling it again for the same
    registry returns the same metrics."""
    registry = REGISTRY if registry is None else registry
    with _registering:
        metrics = _registered.get(registry)
        if metrics is None:
            metrics = _registered[registry] = LockMetrics(registry)
        return metrics


class LockStates(Collector):
    """Holders by kind and state, listed from Redis at each scrape (one listing, as ``celery
    locks list`` makes: a SCAN of the lock keys under the client's prefix)."""

    def __init__(self, client: LockClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        holders = GaugeMetricFamily(
            "celery_singleton_lock_holders",
            "Lock holders now, by kind and state (as `celery locks list` shows them).",
            labels=["kind", "state"],
        )
        try:
            tally = Tally((info.kind, info.state) for info in self.client.locks())
        except LockBackendError:
            # A Redis that does not answer is a value, not a failed scrape: the counters
            # of the same registry still reach Prometheus.
            up = 0.0
        else:
            up = 1.0
            # Zeros too: a series that appears only while something is held leaves panels
            # reading "No data" and absent() alerts firing when nothing is. A failed listing
            # adds none: unknown is not zero.
            for kind in KINDS:
                for state in STATES:
                    holders.add_metric([kind, state], tally.pop((kind, state), 0))
            for (kind, state), count in sorted(tally.items()):  # a kind or state added later
                holders.add_metric([kind, state], count)
        yield holders
        yield GaugeMetricFamily(
            "celery_singleton_lock_listing_up",
            "1 if the last scrape could list the locks, else 0.",
            value=up,
        )


def register_lock_states(
    client_or_app: LockClient | Any, registry: CollectorRegistry | None = None
) -> LockStates:
    """List the locks of ``client_or_app`` (a :class:`LockClient`, or a Celery app: its lock
    client) into ``registry`` (default: prometheus_client's ``REGISTRY``) at each scrape.
    Register it in one process only (the one serving the metrics), not per pool child."""
    if isinstance(client_or_app, LockClient):
        states = LockStates(client_or_app)
    else:
        states = LockStates(lock_client_for(client_or_app))
    (REGISTRY if registry is None else registry).register(states)
    return states
