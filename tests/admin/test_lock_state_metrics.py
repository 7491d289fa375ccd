"""The lock-state gauges (holders by kind and state, read from Redis at each scrape) on a real
Redis, and the shipped Grafana dashboard and alert rules: every metric they query is one this
package exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from celery_singleton_lock import LockClient
from celery_singleton_lock.admin.inspect import KINDS, STATES
from celery_singleton_lock.celery.prometheus import (
    LockMetrics,
    LockStates,
    register_lock_states,
    register_metrics,
)
from celery_singleton_lock.embedded import RedisServer

GRAFANA = Path(__file__).resolve().parent.parent.parent / "docs" / "grafana"


@pytest.fixture
def states(lock_client: LockClient) -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    register_lock_states(lock_client, registry)
    yield registry


def holders(registry: CollectorRegistry, kind: str, state: str) -> float | None:
    return registry.get_sample_value(
        "celery_singleton_lock_holders", {"kind": kind, "state": state}
    )


def test_holders_are_counted_by_kind_and_state(
    lock_client: LockClient, states: CollectorRegistry
) -> None:
    # Nothing held: a zero for every kind and state, so a dashboard panel reads 0, not "No data".
    for kind in KINDS:
        for state in STATES:
            assert holders(states, kind, state) == 0.0, (kind, state)
    assert states.get_sample_value("celery_singleton_lock_listing_up") == 1.0

    live = [lock_client.lease(f"live-{n}", ttl=30) for n in range(3)]
    assert all(lease.acquire() for lease in live)
    stale = lock_client.lease("stale", ttl=30, heartbeat=False)
    assert stale.acquire()
    # A hash that claims a heartbeat and was last renewed 25 s ago (server time) is stale.
    now_ms = int(lock_client.redis.time()[0]) * 1000
    lock_client.redis.hset(stale.keys.lock, mapping={"heartbeat": 1, "renewed_ms": now_ms - 25_000})
    delayed = lock_client.lease("delayed", ttl=30)
    assert delayed.acquire()
    delayed.release(delay=30)
    reader = lock_client.rwlock("doc").read(ttl=30)
    assert reader.acquire()

    assert holders(states, "lease", "live") == 3
    assert holders(states, "lease", "stale") == 1
    assert holders(states, "lease", "release-delay") == 1
    assert holders(states, "read", "live") == 1

    for lease in live:
        lease.release()
    reader.release()
    assert holders(states, "lease", "live") == 0  # read again at the next scrape
    assert holders(states, "read", "live") == 0
    assert holders(states, "lease", "stale") == 1


def test_a_redis_that_does_not_answer_is_listing_up_0_not_a_failed_scrape() -> None:
    with RedisServer() as server:
        client = LockClient.from_url(server.url, prefix="states:", socket_timeout=2)
        registry = CollectorRegistry()
        collector = register_lock_states(client, registry)
        assert isinstance(collector, LockStates)
        metrics = register_metrics(registry)  # counters in the same registry still scrape
        try:
            lease = client.lease("held", ttl=30)
            assert lease.acquire()
            assert holders(registry, "lease", "live") == 1
            server.stop()
            assert registry.get_sample_value("celery_singleton_lock_listing_up") == 0.0
            # Unknown is no sample, not a zero: a zero would say nothing is held.
            assert holders(registry, "lease", "live") is None
            server.start()  # back, empty: nothing persisted
            assert registry.get_sample_value("celery_singleton_lock_listing_up") == 1.0
            assert holders(registry, "lease", "live") == 0
        finally:
            metrics.close()
            client.close()


def test_an_app_gives_its_lock_client(celery_lock_app: object, lock_prefix: str) -> None:
    registry = CollectorRegistry()
    collector = register_lock_states(celery_lock_app, registry)
    assert collector.client.connection.prefix == lock_prefix
    assert registry.get_sample_value("celery_singleton_lock_listing_up") == 1.0


def exported_names() -> set[str]:
    """The sample names Prometheus gets from this package's metrics, by metric type."""
    registry = CollectorRegistry()
    metrics: LockMetrics = register_metrics(registry)
    register_lock_states(LockClient.from_url("redis://127.0.0.1:1/0"), registry)
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    try:
        return {
            family.name + suffix
            for family in registry.collect()
            for suffix in suffixes[family.type]
        }
    finally:
        metrics.close()


QUERIED = re.compile(r"\bcelery_singleton_lock_\w+")


def dashboard_queries() -> list[str]:
    dashboard = json.loads((GRAFANA / "celery_singleton_lock.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return queries


def alert_queries() -> list[str]:
    rules = (GRAFANA / "alerts.yml").read_text()
    # Every rule's expr, folded (">-") or on one line.
    return re.findall(r"expr: (?:>-\n)?((?:.+\n?)+?)\s+(?:labels|for):", rules)


def test_the_dashboard_and_the_alerts_query_only_exported_metrics() -> None:
    exported = exported_names()
    assert "celery_singleton_lock_holders" in exported
    assert "celery_singleton_lock_wait_seconds_bucket" in exported
    for source, queries in (("dashboard", dashboard_queries()), ("alerts", alert_queries())):
        assert queries, source
        queried = {name for query in queries for name in QUERIED.findall(query)}
        assert queried, source
        assert queried <= exported, (source, queried - exported)
    # Every exported metric has a panel.
    panels = {name for query in dashboard_queries() for name in QUERIED.findall(query)}
    families = {
        name.removesuffix("_bucket") for name in exported if not name.endswith(("_sum", "_count"))
    }
    assert {name.removesuffix("_bucket") for name in panels} >= families
