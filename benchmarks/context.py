"""Where the benchmarks run: a throwaway redis-server, or ``$REDIS_URL`` under a unique prefix."""

from __future__ import annotations

import argparse
import os
import platform
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from celery_singleton_lock.embedded import RedisServer


@dataclass
class Context:
    """What every section gets: the server, the run's key namespace and the options."""

    url: str
    run_id: str
    options: argparse.Namespace
    embedded: bool
    redis_version: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def quick(self) -> bool:
        return bool(self.options.quick)

    def prefix(self, section: str) -> str:
        """A key prefix unique to this run and section; every key a benchmark makes must
        contain ``run_id`` so that the clean-up at the end finds it."""
        return f"bench:{self.run_id}:{section}:"

    def redis(self, **kwargs: Any) -> redis.Redis:
        """A plain redis-py client on the benchmark server (hiredis parses when installed)."""
        return redis.Redis.from_url(self.url, **kwargs)

    def pick(self, option: str, quick: int, full: int) -> int:
        """The value of ``--option`` if given, else the quick or the full default."""
        value = getattr(self.options, option, None)
        if value is not None:
            return int(value)
        return quick if self.quick else full

    def describe(self) -> str:
        where = "throwaway redis-server" if self.embedded else "REDIS_URL (shared, not flushed)"
        return (
            f"Redis {self.redis_version} ({where}), Python {platform.python_version()}, "
            f"redis-py {redis.__version__}, {os.cpu_count()} CPUs"
        )


@contextmanager
def open_context(options: argparse.Namespace) -> Iterator[Context]:
    """Start a private redis-server unless ``REDIS_URL`` is set; delete the run's keys after."""
    url = os.environ.get("REDIS_URL")
    server = None
    if not url:
        server = RedisServer()
        server.start()
        url = server.url
    ctx = Context(
        url=url, run_id=uuid.uuid4().hex[:12], options=options, embedded=server is not None
    )
    try:
        probe = ctx.redis()
        try:
            ctx.redis_version = str(probe.info("server")["redis_version"])
        finally:
            probe.close()
        yield ctx
    finally:
        try:
            if server is None:
                delete_run_keys(ctx)
        finally:
            if server is not None:
                server.close()


def delete_run_keys(ctx: Context) -> int:
    """Delete every key whose name contains the run id (never FLUSHDB: the server is shared)."""
    client = ctx.redis()
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"*{ctx.run_id}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(client.unlink(*batch))
    finally:
        client.close()
    return deleted
