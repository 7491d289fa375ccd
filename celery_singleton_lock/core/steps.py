"""The instructions a lock operation yields, written once for the sync and asyncio handles.

Each operation of a handle (acquire, release, extend, a fair wait, an upgrade, ...) is a
generator: it yields what it needs done and receives the result; an error from doing it is
thrown into the generator, so its ``try``/``except``/``finally`` (undoing an acquire's
attempts, withdrawing a wait, riding out an outage) is written once. The sync runner
(:meth:`.handle.LockHandle._run`) does the I/O with threads, the asyncio one
(``aio.handle.AsyncLockHandle._run``) awaits it. The instructions:

- a :data:`.scripts.ScriptCall` (a tuple): run that one script; its reply;
- :class:`Batch`: run script calls in one round trip; their replies;
- :class:`Listen`: subscribe to release channels until the operation ends;
- :class:`Pause`: sleep, woken early by a release while listening;
- :class:`Blpop`: block on a list (a fair waiter's hand-off); BLPOP's reply.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, TypeVar

from .scripts import ScriptCall

T = TypeVar("T")


class Batch:
    """Run ``calls`` in one round trip (with the connection's WAIT, where it has one)."""

    __slots__ = ("calls",)

    def __init__(self, calls: Sequence[ScriptCall]) -> None:
        self.calls = calls


class Listen:
    """Listen to releases published on ``channels`` from now until the operation ends."""

    __slots__ = ("channels",)

    def __init__(self, channels: tuple[bytes, ...]) -> None:
        self.channels = channels


class Pause:
    """Sleep ``seconds``; while listening, a release on a channel ends it early."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class Blpop:
    """``BLPOP key timeout`` on a connection of its own; None when it timed out."""

    __slots__ = ("key", "timeout")

    def __init__(self, key: bytes, timeout: float) -> None:
        self.key = key
        self.timeout = timeout


Step = ScriptCall | Batch | Listen | Pause | Blpop

#: An operation: yields steps, is sent each one's result, returns a ``T``.
Steps = Generator[Step, Any, T]
