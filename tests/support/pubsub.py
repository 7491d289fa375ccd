"""A real pub/sub subscriber on a lock's wake-up channel, for the tests that count what
releases publish. To tell "nothing was published" without waiting for a timeout, it
publishes a probe of its own: whatever arrives before the probe was published before it."""

from __future__ import annotations

import time

import pytest

from celery_singleton_lock import LockClient

PROBE = b"probe"


class Channel:
    """A subscriber to one lock's wake-up channel."""

    def __init__(self, client: LockClient, channel: bytes) -> None:
        self._channel = channel
        self._redis = client.redis
        self._pubsub = client.redis.pubsub()
        self._pubsub.subscribe(channel)
        confirmed = self._pubsub.get_message(timeout=10)
        assert confirmed is not None and confirmed["type"] == "subscribe", confirmed

    def published(self) -> list[bytes]:
        """What was published on the channel since the last call."""
        self._redis.publish(self._channel, PROBE)
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            message = self._pubsub.get_message(timeout=deadline - time.monotonic())
            if message is None or message["type"] != "message":
                continue
            if message["data"] == PROBE:
                return seen
            seen.append(message["data"])
        pytest.fail("the probe message never arrived")

    def close(self) -> None:
        self._pubsub.close()
