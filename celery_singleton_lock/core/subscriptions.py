"""The pub/sub protocol of the waiter listeners, without I/O: which channels one connection is
subscribed to and who waits on each, when a waiter's subscription is live, whom a message
wakes, and what a refusal or a node's own ``sunsubscribe`` means on a Redis Cluster.

The thread listener (:mod:`.notifier`) and the asyncio one (:mod:`..aio.notifier`) drive it:
they send what it says to send and feed it what they read, each in its own execution model
(the thread one under its lock). It never blocks and sends nothing itself.

Replies arrive in the order commands were sent, so counting the ``subscribe``
acknowledgements per channel against the SUBSCRIBEs sent tells each waiter when *its*
subscription is live. A channel whose last waiter left stays subscribed until its driver
sends the UNSUBSCRIBE (:meth:`Subscriptions.unsubscribable`): a waiter that comes back
meanwhile keeps it, with no SUBSCRIBE.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import redis

log = logging.getLogger("celery_singleton_lock.waiting")

#: A listener reconnecting after its connection was lost waits this long first (doubling up
#: to ``RECONNECT_DELAY_MAX``).
RECONNECT_DELAY = 0.05
RECONNECT_DELAY_MAX = 2.0


class Settable(Protocol):
    """A waiter's wake-up, or a subscription's confirmation."""

    def set(self) -> None: ...


class Event(Settable, Protocol):
    def clear(self) -> None: ...

    def is_set(self) -> bool: ...


W = TypeVar("W", bound=Settable)
E = TypeVar("E", bound=Event)

_MESSAGE = frozenset((b"message", "message", b"smessage", "smessage"))
_SUBSCRIBED = frozenset((b"subscribe", "subscribe", b"ssubscribe", "ssubscribe"))
_SLOT_LEFT = frozenset((b"sunsubscribe", "sunsubscribe"))


class _Channel(Generic[W, E]):
    __slots__ = ("confirmed", "need", "waiters")

    def __init__(self, confirmed: E) -> None:
        self.waiters: set[W] = set()
        self.confirmed = confirmed
        #: How many SUBSCRIBEs of the channel must be acknowledged before it is live.
        self.need = 0


class Subscriptions(Generic[W, E]):
    """The channels of one pub/sub connection and their waiters (``W``: what a waiter
    sleeps on), a confirmation per channel made by ``new_event``."""

    def __init__(self, new_event: Callable[[], E]) -> None:
        self._new_event = new_event
        self._channels: dict[bytes, _Channel[W, E]] = {}
        self._sent: Counter[bytes] = Counter()
        self._acked: Counter[bytes] = Counter()
        #: SUNSUBSCRIBEs sent and not yet answered per channel: an ``sunsubscribe`` beyond
        #: them is the node's own (the channel's slot left it).
        self._unsubscribing: Counter[bytes] = Counter()
        #: Whether the connection's server has sharded pub/sub (found at each connect).
        self.sharded = False

    def join(self, channel: bytes, wakeup: W) -> tuple[E, bool]:
        """``wakeup`` waits on ``channel``: the event set once the channel's subscription
        is live, and whether to send a SUBSCRIBE (False: the channel is subscribed already,
        or about to be)."""
        state = self._channels.get(channel)
        new = state is None
        if state is None:
            state = self._channels[channel] = _Channel(self._new_event())
            self._sent[channel] += 1
            state.need = self._sent[channel]
            if self._acked[channel] >= state.need:
                state.confirmed.set()
        state.waiters.add(wakeup)
        return state.confirmed, new

    def leave(self, channel: bytes, wakeup: W) -> bool:
        """``wakeup`` leaves ``channel``; whether other waiters are left on it (if not, the
        driver has it unsubscribed later: :meth:`unsubscribable`)."""
        state = self._channels.get(channel)
        if state is None:
            return False
        state.waiters.discard(wakeup)
        return bool(state.waiters)

    def unsubscribable(self, channels: Iterable[bytes]) -> list[bytes]:
        """Those of ``channels`` no waiter came back to, forgotten here: the driver sends
        their UNSUBSCRIBE."""
        gone = []
        for channel in channels:
            state = self._channels.get(channel)
            if state is not None and not state.waiters:
                del self._channels[channel]
                gone.append(channel)
        return gone

    def command(self, command: str, channel: bytes) -> str:
        """The command to send for ``command`` (SUBSCRIBE or UNSUBSCRIBE) on ``channel``:
        its sharded form on a server that has sharded pub/sub."""
        if not self.sharded:
            return command
        if command == "UNSUBSCRIBE":
            self._unsubscribing[channel] += 1
        return "S" + command

    def reconnected(self, sharded: bool) -> tuple[str, list[bytes]]:
        """A new connection (``sharded``: its server has sharded pub/sub) has no
        subscriptions: the command and the channels to subscribe on it, those with waiters.
        Channels left meanwhile are dropped."""
        self.sharded = sharded
        self._sent.clear()
        self._acked.clear()
        self._unsubscribing.clear()
        for channel in [c for c, state in self._channels.items() if not state.waiters]:
            del self._channels[channel]
        for channel, state in self._channels.items():
            self._sent[channel] += 1
            state.need = self._sent[channel]
            state.confirmed.clear()
        return ("SSUBSCRIBE" if sharded else "SUBSCRIBE"), list(self._channels)

    def dispatch(self, reply: Any) -> list[bytes]:
        """Apply one reply read from the connection: a message wakes its channel's
        waiters, an acknowledgement may make a subscription live. The channels the node no
        longer listens to (an ``sunsubscribe`` that answers none of ours: the slot left it)."""
        if not isinstance(reply, list) or len(reply) < 3:
            return []
        kind, channel = reply[0], reply[1]
        if isinstance(channel, str):
            channel = channel.encode()
        if kind in _MESSAGE:
            state = self._channels.get(channel)
            if state is not None:
                for wakeup in state.waiters:
                    wakeup.set()
        elif kind in _SUBSCRIBED:
            self._acked[channel] += 1
            state = self._channels.get(channel)
            if state is not None and self._acked[channel] >= state.need:
                state.confirmed.set()
        elif kind in _SLOT_LEFT:
            if self._unsubscribing[channel] <= 0:
                return [channel]
            self._unsubscribing[channel] -= 1
        return []

    def refused(
        self, exc: redis.ResponseError, keyslot: Callable[[bytes], int] | None
    ) -> list[bytes]:
        """A command refused with ``exc``: with MOVED (or ASK) on a Cluster (``keyslot``
        given), the channels of that slot, on another node now; else none, logged."""
        slot = redirected_slot(exc)
        if slot is None or keyslot is None:
            log.warning("pub/sub command refused: %s", exc)
            return []
        return [channel for channel in self._channels if keyslot(channel) == slot]

    def take(self, channel: bytes) -> set[W]:
        """Forget ``channel``, no longer subscribed here (its slot moved, or the connection
        is gone); its waiters, for another node's listener."""
        state = self._channels.pop(channel, None)
        # Its subscription's answer will never come here: the count starts over.
        self._acked[channel] = self._sent[channel]
        return set() if state is None else state.waiters

    def wake_all(self) -> None:
        """The connection is gone: a release may have gone unheard, so every waiter looks
        again now rather than at its hint."""
        for state in self._channels.values():
            for wakeup in state.waiters:
                wakeup.set()

    def waited(self) -> list[bytes]:
        """The channels that have waiters."""
        return [channel for channel, state in self._channels.items() if state.waiters]

    def listens_to(self, channel: bytes) -> bool:
        """Whether ``channel`` is subscribed (or about to be, or left and not yet
        unsubscribed)."""
        return channel in self._channels

    def waiters(self, channel: bytes) -> int:
        """How many waiters wait on ``channel``."""
        state = self._channels.get(channel)
        return 0 if state is None else len(state.waiters)

    def subscribes_sent(self, channel: bytes) -> int:
        """SUBSCRIBEs of ``channel`` sent on this connection (each waiter that found it
        unsubscribed sent one)."""
        return self._sent[channel]

    def __bool__(self) -> bool:
        return bool(self._channels)


def redirected_slot(exc: redis.ResponseError) -> int | None:
    """The slot of a MOVED or ASK error, else None."""
    if isinstance(exc, redis.exceptions.AskError):  # MovedError too
        return exc.slot_id
    words = str(exc).split()
    if len(words) == 3 and words[0] in ("MOVED", "ASK") and words[1].isdigit():
        return int(words[1])
    return None


class Listener(Protocol[W]):
    """What :class:`Placement` needs of one node's listener (thread or asyncio)."""

    def listens_to(self, channel: bytes) -> bool: ...

    def _remove(self, channel: bytes, wakeup: W) -> bool: ...

    def take(self, channel: bytes) -> set[W]: ...


L = TypeVar("L", bound=Listener[Any])


class Placement(Generic[L]):
    """On a Redis Cluster, which node's listener each channel is subscribed with: the node
    owning its slot when it was placed, until its last waiter leaves or it moves."""

    def __init__(self) -> None:
        #: Node name -> its listener.
        self.nodes: dict[str, L] = {}
        #: Channel -> the listener it is subscribed with, while it has waiters.
        self.where: dict[bytes, L] = {}

    def current(self, channel: bytes) -> L | None:
        """The listener ``channel`` is subscribed with still, if any."""
        listener = self.where.get(channel)
        return listener if listener is not None and listener.listens_to(channel) else None

    def place(self, channel: bytes, node: str, make: Callable[[str], L]) -> L:
        """Subscribe ``channel`` with the listener of ``node`` (``make`` makes it)."""
        listener = self.nodes.get(node)
        if listener is None:
            listener = self.nodes[node] = make(node)
        self.where[channel] = listener
        return listener

    def leave(self, channels: Iterable[bytes], wakeup: Any) -> None:
        """``wakeup`` leaves ``channels``."""
        for channel in channels:
            listener = self.where.get(channel)
            if listener is not None and not listener._remove(channel, wakeup):
                # No waiter left: a later one finds its slot's node again.
                del self.where[channel]

    def take(self, old: L, channel: bytes) -> set[Any]:
        """``old`` no longer listens to ``channel``: its waiters, to place again."""
        waiters = old.take(channel)
        if self.where.get(channel) is old:
            del self.where[channel]
        return waiters

    def placed(self) -> list[bytes]:
        """The channels subscribed somewhere."""
        return list(self.where)
