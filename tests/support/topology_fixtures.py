"""The fixtures of the tests on local Redis topologies, loaded by the tests' conftest: a test
module that asks for ``cluster`` (three masters) or ``sentinels`` (a master, a replica and a
sentinel) gets one of its own; ``client`` is a LockClient on the cluster and ``prefix`` a key
prefix unique to the test, per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from celery_singleton_lock import LockClient

from .redis_topologies import Cluster, SentinelSet, running


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running(Cluster(3)) as topology:
        yield topology


@pytest.fixture
def client(cluster: Cluster) -> Iterator[LockClient]:
    made = LockClient.from_url(cluster.url, prefix=f"csltest:{uuid.uuid4().hex[:12]}:")
    yield made
    made.close()


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    with running(SentinelSet()) as topology:
        yield topology


@pytest.fixture
def prefix(lock_prefix: str) -> str:
    """A key prefix unique to the test (the plugin's ``lock_prefix``)."""
    return lock_prefix
