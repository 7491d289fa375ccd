"""Lock names -> Redis keys: a name that cannot be its own hash tag (braces, too long, a
leading "#", not valid UTF-8) is tagged by its SHA-256, which must never change: the keys
of every lock held or claimed before an upgrade are found by it. Values a user or broker
supplies (task ids) go into keys escaped, and no escaped value makes a key that a listing's
pattern matches (tests/test_key_escaping.py runs them on a real worker)."""

from __future__ import annotations

import hashlib
import re
from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
