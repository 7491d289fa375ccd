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
- :class:`Blpop`: block on a list (a fair waiter's hand-off); BLPOP's reply;
- :class:`Command`: one Redis command (TIME, HGETALL...); its reply as redis-py parses it;
- :class:`Pipeline`: commands in one round trip (no transaction); their replies;
- :class:`Scan`: the keys a SCAN walks (a listing's);
- :class:`CheckLayout`: check the key layout versions under the prefix (core/layout.py),
  recording them only with ``record``; the runner does it before a connection's first
  script call anyway.

The runners are the connections' (``Connection.run``, ``AsyncConnection.run``): the handles'
operations and the admin's (listing, clearing, releasing a dead task's hold, the server's
clock) are written once as steps, for both.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from itertools import islice
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


class Command:
    """One Redis command: the redis-py client's method ``method`` (``"time"``,
    ``"hgetall"``...) called with ``args``; its reply."""

    __slots__ = ("method", "args")

    def __init__(self, method: str, *args: Any) -> None:
        self.method = method
        self.args = args

    def of(self, redis: Any) -> Any:
        """The call on ``redis`` (sync: the reply; asyncio: its awaitable), or on a
        pipeline (queued)."""
        return getattr(redis, self.method)(*self.args)


class Pipeline:
    """``commands`` (each a :class:`Command`'s method and arguments) in one round trip, no
    transaction; the replies in order. With ``keep_errors`` an error reply is kept in its
    place rather than raised (a listing's read of a key of another type, see core/scan.py)."""

    __slots__ = ("commands", "keep_errors")

    def __init__(self, commands: Sequence[tuple[Any, ...]], *, keep_errors: bool = False) -> None:
        self.commands = commands
        self.keep_errors = keep_errors

    def run(self, redis: Any) -> Any:
        """Send it on ``redis`` (sync: the replies; asyncio: their awaitable)."""
        pipe = redis.pipeline(transaction=False)
        for method, *args in self.commands:
            Command(method, *args).of(pipe)
        return pipe.execute(raise_on_error=not self.keep_errors)


class Scan:
    """The keys matching the glob ``match`` (None: every key), ``count`` asked per SCAN
    page, in the order SCAN walks them (a key may come twice), at most ``limit`` of them
    (None: all). On a Redis Cluster client, every primary's."""

    __slots__ = ("match", "count", "limit")

    def __init__(self, match: bytes | None, count: int, limit: int | None = None) -> None:
        self.match = match
        self.count = count
        self.limit = limit

    def keys(self, redis: Any) -> list[bytes]:
        """The keys, read with a sync ``redis`` (the asyncio connection iterates itself)."""
        return list(islice(redis.scan_iter(match=self.match, count=self.count), self.limit))


class CheckLayout:
    """Check the key layout versions under the connection's prefix (core/layout.py) if they
    were not found equal yet, recording this process's where none are only with
    ``record`` (a listing only reads)."""

    __slots__ = ("record",)

    def __init__(self, *, record: bool = True) -> None:
        self.record = record


Step = ScriptCall | Batch | Listen | Pause | Blpop | Command | Pipeline | Scan | CheckLayout

#: An operation: yields steps, is sent each one's result, returns a ``T``.
Steps = Generator[Step, Any, T]


def server_clock() -> Steps[tuple[int, int]]:
    """The server's clock: TIME's (seconds, microseconds)."""
    seconds, micros = yield Command("time")
    return int(seconds), int(micros)


def server_ms() -> Steps[int]:
    """The server's clock in ms (the clock every lock time is written with)."""
    seconds, micros = yield from server_clock()
    return seconds * 1000 + micros // 1000


def server_seconds() -> Steps[float]:
    """The server's clock, in seconds since the epoch."""
    seconds, micros = yield from server_clock()
    return seconds + micros / 1_000_000


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
