"""The pub/sub protocol both waiter listeners drive (core/subscriptions.py), fed replies as a
connection would read them. (The listeners on a real Redis: test_notifier.py,
test_async_notifier.py, test_sharded_pubsub.py.)"""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from celery_singleton_lock.core.notifier import QueueWakeup
from celery_singleton_lock.core.subscriptions import Subscriptions


def protocol() -> Subscriptions[QueueWakeup, threading.Event]:
    return Subscriptions(threading.Event)


def test_one_subscribe_per_channel_and_its_acknowledgement_makes_it_live() -> None:
    subs = protocol()
    confirmed, send = subs.join(b"a", QueueWakeup())
    assert send and not confirmed.is_set()
    assert subs.join(b"a", QueueWakeup()) == (confirmed, False)  # a second waiter sends none
    assert subs.unsubscribable([b"a"]) == []  # it has waiters: kept
    assert subs.subscribes_sent(b"a") == 1 and subs.waiters(b"a") == 2
    subs.dispatch([b"subscribe", b"a", 1])
    assert confirmed.is_set()


def test_an_acknowledgement_meant_for_an_earlier_subscribe_does_not_confirm_a_later_one() -> None:
    subs = protocol()
    waiter = QueueWakeup()
    subs.join(b"a", waiter)
    assert not subs.leave(b"a", waiter)
    assert subs.unsubscribable([b"a"]) == [b"a"]
    again, send = subs.join(b"a", waiter)
    assert send and subs.subscribes_sent(b"a") == 2
    subs.dispatch([b"subscribe", b"a", 1])  # the answer to the first SUBSCRIBE
    assert not again.is_set()
    subs.dispatch([b"subscribe", b"a", 1])
    assert again.is_set()


def test_a_message_wakes_the_waiters_of_its_channel_only() -> None:
    subs = protocol()
    on_a, on_b = QueueWakeup(), QueueWakeup()
    subs.join(b"a", on_a)
    subs.join(b"b", on_b)
    assert subs.dispatch([b"smessage", "a", b"released"]) == []
    assert on_a.wait(0) and not on_b.wait(0)


def test_a_reconnect_subscribes_the_waited_channels_again_and_drops_the_left_ones() -> None:
    subs = protocol()
    waiter, gone = QueueWakeup(), QueueWakeup()
    confirmed, _ = subs.join(b"kept", waiter)
    subs.join(b"left", gone)
    subs.dispatch([b"subscribe", b"kept", 1])
    assert not subs.leave(b"left", gone)
    assert subs.reconnected(sharded=True) == ("SSUBSCRIBE", [b"kept"])
    assert not confirmed.is_set() and not subs.listens_to(b"left")
    subs.dispatch([b"ssubscribe", b"kept", 1])
    assert confirmed.is_set()


def test_only_an_sunsubscribe_that_answers_none_of_ours_hands_the_channel_back() -> None:
    subs = protocol()
    subs.reconnected(sharded=True)
    subs.join(b"a", QueueWakeup())
    assert subs.command("UNSUBSCRIBE", b"a") == "SUNSUBSCRIBE"
    assert subs.dispatch([b"sunsubscribe", b"a", 0]) == []  # the answer to ours
    assert subs.dispatch([b"sunsubscribe", b"a", 0]) == [b"a"]  # the node's own: slot left


def test_a_moved_refusal_names_the_channels_of_that_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    subs = protocol()
    for channel in (b"a", b"b", b"c"):
        subs.join(channel, QueueWakeup())
    slots = {b"a": 7, b"b": 9, b"c": 7}
    moved = redis.ResponseError("MOVED 7 127.0.0.1:7001")
    assert subs.refused(moved, slots.__getitem__) == [b"a", b"c"]
    with caplog.at_level(logging.WARNING, "celery_singleton_lock.waiting"):
        assert subs.refused(redis.ResponseError("NOPERM no"), slots.__getitem__) == []
        assert subs.refused(moved, None) == []  # not on a Cluster: nothing to move
    assert len(caplog.records) == 2
