"""The fixtures of the tests on a local three-master Redis Cluster: a module imports them, and
each such module gets a cluster of its own (module scope) and a client per test with a key
prefix of its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from celery_singleton_lock import LockClient

from .redis_topologies import Cluster, running


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running(Cluster(3)) as topology:
        yield topology


@pytest.fixture
def client(cluster: Cluster) -> Iterator[LockClient]:
    made = LockClient.from_url(cluster.url, prefix=f"csltest:{uuid.uuid4().hex[:12]}:")
    yield made
    made.close()
