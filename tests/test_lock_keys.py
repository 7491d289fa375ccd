"""Lock names -> Redis keys: a name that cannot be its own hash tag (braces, too long, a
leading "#", not valid UTF-8) is tagged by its SHA-256, which must never change: the keys
of every lock held or claimed before an upgrade are found by it."""

from __future__ import annotations

import hashlib

import pytest

from celery_singleton_lock.core.keys import MAX_PLAIN_NAME, encode_name, lock_keys, name_tag


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
