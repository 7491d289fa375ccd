"""Lock names -> Redis keys: a name that cannot be its own hash tag (braces, too long, a
leading "#", not valid UTF-8) is tagged by its SHA-256, which must never change: the keys
of every lock held or claimed before an upgrade are found by it. Values a user or broker
supplies (task ids) go into keys escaped, and no escaped value makes a key that a listing's
pattern matches (tests/tasks/test_key_escaping.py runs them on a real worker). A lease, a
reader-writer lock and a range lock of one name are separate locks sharing one fencing
counter."""

from __future__ import annotations

import hashlib
import math
import re
from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.keys import (
    MAX_PLAIN_NAME,
    data_key,
    encode_name,
    key_part,
    lock_keys,
    name_tag,
)


def test_the_keys_of_a_default_task_key_are_the_ones_they_always_were() -> None:
    keys = lock_keys("csl:", 'tasks.job:{"i":1}')
    tag = b"csl:{#6da975b1f38d793b9432cf7ac331913577c0e5e4}:"
    assert (keys.lock, keys.fence, keys.channel) == (tag + b"lock", tag + b"fence", tag + b"chan")
    assert lock_keys("csl:", "plain").lock == b"csl:{plain}:lock"


@pytest.mark.parametrize(
    "name",
    [
        'tasks.job:{"i":1}',
        "x" * (MAX_PLAIN_NAME + 1),
        "#starts with a hash",
        "close } brace",
        "ünïcode {" * 40,
        "lone \ud800 surrogate {",
    ],
)
def test_a_hashed_tag_is_the_sha256_of_the_name(name: str) -> None:
    digest = hashlib.sha256(encode_name(name)).hexdigest()[:40]
    assert name_tag(name) == b"#" + digest.encode()


def unescaped(part: str) -> str:
    """The value :func:`key_part` escaped into ``part``."""
    return re.sub(r"%([0-9A-F]{2})", lambda found: chr(int(found[1], 16)), part)


@given(name=st.text(min_size=1), task_id=st.text(), attempt=st.integers(min_value=0))
def test_no_task_id_or_name_makes_a_mark_key_that_a_listing_pattern_matches(
    name: str, task_id: str, attempt: int
) -> None:
    part = key_part(task_id)
    assert unescaped(part) == task_id  # one value, one part
    base = lock_keys("csl:", name).base
    for key in (data_key(base, "done", task_id), data_key(base, "waiting", task_id, attempt)):
        text = key.decode("utf-8", "surrogatepass")
        # The listings' SCAN globs (core/keys.lock_pattern, kinds/intervals.holder_match);
        # none has a glob character fnmatch reads otherwise than Redis.
        for pattern in ("csl:{*}:lock", "csl:{*}:rw:h:*", "csl:{*}:range:h:*", "csl:{*}:sem:h:*"):
            assert not fnmatchcase(text, pattern), (key, pattern)
        assert text.count("{") == 1 and text.count("}") == 1


def test_a_lease_an_rwlock_and_a_range_lock_of_one_name_do_not_exclude_each_other(
    lock_client: LockClient,
) -> None:
    """Documented next to ``lock_key`` (README) and in docs/locks.md: the three kinds are
    separate namespaces under one name; only their fencing counter is shared. A multi-key
    lock, made of leases, does exclude a lease of one of its names."""
    lease = lock_client.lease("doc", ttl=60.0)
    writer = lock_client.rwlock("doc").write(ttl=60.0)
    ranged = lock_client.range_lock("doc").write(-math.inf, math.inf, ttl=60.0)
    assert lease.acquire(0) and writer.acquire(0) and ranged.acquire(0)
    assert lease.token is not None and writer.token is not None and ranged.token is not None
    assert lease.token < writer.token < ranged.token  # one counter for the name

    assert not lock_client.multi(["doc", "other"]).acquire(0)
    assert not lock_client.lease("doc").acquire(0)
    assert not lock_client.rwlock("doc").read().acquire(0)
    assert not lock_client.range_lock("doc").read(0, 1).acquire(0)
    for handle in (lease, writer, ranged):
        handle.release()
