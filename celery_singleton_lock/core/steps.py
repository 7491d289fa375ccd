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

from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from ..exceptions import LockNotReplicated
from .scripts import ScriptCall, joined_call

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


def along(
    steps: Steps[T], extra: ScriptCall, replies: list[Any], *, first: bool = False
) -> Steps[T]:
    """A handle operation's ``steps``, with ``extra`` (another script call, in the same slot)
    joined to its script calls (:func:`.scripts.joined`: one call runs both): with ``first``,
    run before the operation's first call only; else after each of its calls (in a
    :class:`Batch`, its last). The replies ``extra`` got are appended to ``replies``. The
    operation sees its own replies and errors as if ``extra`` were not there."""
    added = False
    send: Callable[[Any], Any] = steps.send
    value: Any = None
    while True:
        try:
            step = send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        send = steps.send
        single = type(step) is tuple
        if (single or isinstance(step, Batch)) and not (first and added):
            calls: list[ScriptCall] = [step] if single else list(step.calls)
            at = 0 if first else len(calls) - 1
            calls[at] = joined_call(extra, calls[at]) if first else joined_call(calls[at], extra)
            added = True
            try:
                answer = yield calls[0] if single else Batch(calls)
            except LockNotReplicated as exc:
                # The scripts ran on the master: the operation reads its own replies.
                own = list(exc.replies)
                if len(own) > at:
                    own[at] = _split(own[at], first, replies)
                error = LockNotReplicated(
                    str(exc), name=exc.name, replies=own, acknowledged=exc.acknowledged
                )
                send, value = thrower(steps, error), None
                continue
            except BaseException as exc:
                send, value = thrower(steps, exc), None
                continue
            if single:
                value = _split(answer, first, replies)
            else:
                value = list(answer)
                value[at] = _split(value[at], first, replies)
            continue
        try:
            value = yield step
        except BaseException as exc:
            send, value = thrower(steps, exc), None


def _split(reply: Any, first: bool, replies: list[Any]) -> Any:
    """A joined call's ``reply``: ``extra``'s part appended to ``replies``, the operation's
    own part returned."""
    own, extra = (reply[1], reply[0]) if first else (reply[0], reply[1])
    replies.append(extra)
    return own


def thrower(steps: Steps[Any], error: BaseException) -> Callable[[Any], Any]:
    """A ``send`` that throws ``error`` into ``steps`` instead."""
    return lambda _: steps.throw(error)
