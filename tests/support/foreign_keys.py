"""Keys a listing's SCAN patterns match that are not lock hashes: the patterns themselves,
and foreign keys of other types planted under a test's prefix."""

from __future__ import annotations

import uuid

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.keys import lock_pattern
from celery_singleton_lock.kinds.intervals import holder_match


def listing_patterns(prefix: str) -> list[bytes]:
    """Every SCAN glob a listing reads keys by: the lease keys, each interval family's
    holder hashes."""
    families = (b"rw", b"range", b"sem")
    return [lock_pattern(prefix), *(holder_match(prefix, family) for family in families)]


def scanned(client: LockClient, pattern: bytes) -> list[bytes]:
    return sorted(client.redis.scan_iter(match=pattern, count=1000))


def plant_foreign_keys(client: LockClient, prefix: str) -> list[bytes]:
    """Keys of other types than a hash that match the listing patterns (another program's
    under the same prefix, or what an earlier release wrote): a string on the lease
    pattern, a list and a set on holder patterns."""
    redis = client.redis
    keys = [
        f"{prefix}{{done-mark}}:done:x}}:lock".encode(),
        f"{prefix}{{a}}:rw:h:listed".encode(),
        f"{prefix}{{b}}:range:h:{uuid.uuid4().hex}".encode(),
    ]
    redis.set(keys[0], 0)
    redis.rpush(keys[1], "x")
    redis.sadd(keys[2], "y")
    for key in keys:
        assert any(key in scanned(client, pattern) for pattern in listing_patterns(prefix))
    return keys
