"""The integer reply codes of the Lua scripts (``lua/*.lua``): one enum, :class:`Reply`, in
which each value has one meaning in every script. The values are the scripts' own (each
script's header lists the codes it answers): Python compares replies against these members,
never against bare numbers.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

__all__ = ["Reply", "acquire_outcome"]


class Reply(IntEnum):
    """What a script call did. A renewal (renew.lua, multi_renew.lua, rw_renew.lua,
    interval_renew.lua) replies with the ms granted (> 0) instead of ``DONE``; every code but
    ``DONE`` is 0 or below, so it never reads as a grant."""

    #: Done as asked: taken (acquire.lua, multi_acquire.lua and every other acquire: the
    #: first item of a table reply; see :func:`acquire_outcome`), released or handed over,
    #: cleared (its waiters woken), a waiter's reservation withdrawn, a change made (shrink,
    #: upgrade, downgrade, unreserve). Also for the same call sent again after its reply was
    #: lost: each call that frees a hold leaves a trace of what it freed.
    DONE = 1
    #: Not held any more: expired, cleared, or released already (a supervisor's release: not
    #: held by that task in that process on that host; a clear: released, expired or taken
    #: again since it was listed). acquire_undo.lua: the failed attempt took nothing.
    GONE = 0
    #: Another owner holds the name (or it is in another holder's release delay); for a clear
    #: or a release given a fencing token: another holder's (its token differs). Left alone.
    TAKEN = -1
    #: A renewal past the hold's max-hold: not renewed, the hold runs out on its own.
    MAX_HOLD_REACHED = -2
    #: The parent upgradable hold is gone or does not cover the interval (interval_acquire),
    #: or the hold is not held or not in the mode the change needs (interval_change,
    #: rw_change).
    PARENT_GONE = -3
    #: A shrink whose new interval is not inside the held one.
    NOT_INSIDE = -4
    #: An acquire given a call identity (rw_acquire.lua, interval_acquire.lua,
    #: semaphore_acquire.lua) met a hold of that same call identity on the lock: nothing
    #: granted; the second item is the ms that hold has left. Another delivery of one call
    #: must not hold beside it, even where holds share.
    HELD_BY_CALL = -5
    #: A clear of a holder listed stale that was renewed since: its heartbeat resumed (a
    #: paused process, a prompt left open). Left alone.
    RESUMED = -6
    #: An acquire (or an upgrade) met conflicting holders: the second item says how long a
    #: waiter may sleep.
    BUSY = -7
    #: acquire_undo.lua: the failed attempt had taken a claim over; the claim is back as it
    #: was.
    CLAIM_RESTORED = -8
    #: acquire_undo.lua: the failed attempt holds the name: the caller releases it.
    HELD = -9


def acquire_outcome(reply: Any) -> tuple[int, int]:
    """(code, value) of an acquire script's reply (acquire.lua, rw_acquire.lua,
    interval_acquire.lua, semaphore_acquire.lua): a hold taken is replied as its fencing
    token alone, (``Reply.DONE``, token) here; any other outcome as a table whose first items
    are the code and its value.

    The token alone because a table reply costs Redis about 1 µs per call to build, convert
    and collect: a tenth of an uncontended acquire's server time."""
    if isinstance(reply, bytes):
        return Reply.DONE, int(reply)
    return int(reply[0]), int(reply[1])
