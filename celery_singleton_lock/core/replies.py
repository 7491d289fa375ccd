"""The integer reply codes of the Lua scripts (``lua/*.lua``), one enum per family of scripts
whose codes mean the same thing. The values are the scripts' own: Python compares replies
against these members, never against bare numbers.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

__all__ = [
    "AcquireReply",
    "ClearReply",
    "HolderReply",
    "IntervalReply",
    "UndoReply",
    "acquire_outcome",
]


class HolderReply(IntEnum):
    """What a holder's own call on its lock found: release.lua, handover.lua, renew.lua,
    multi_release.lua, multi_renew.lua, interval_renew.lua, release_holder.lua, and the
    release of a claim acquire.lua makes first (its third reply item). A renewal replies
    with the ms granted (> 0) instead of ``DONE``."""

    #: Released or handed over (also when sent again after its reply was lost).
    DONE = 1
    #: Not held any more: expired, cleared, or released already (release_holder.lua: not
    #: held by that task in that process on that host).
    GONE = 0
    #: Another owner holds the name (or it is in another holder's release delay).
    TAKEN = -1
    #: A renewal past the hold's max-hold: not renewed, the hold runs out on its own.
    MAX_HOLD_REACHED = -2


class ClearReply(IntEnum):
    """What clearing a listed holder did: clear.lua, and interval_release.lua and
    rw_release.lua when given the listed fencing token (and last renewal)."""

    #: Cleared; its waiters were woken. Also for the same clear sent again after its reply
    #: was lost: the clear leaves a trace of what it freed.
    CLEARED = 1
    #: Released, expired or taken again since it was listed: nothing to clear.
    GONE = 0
    #: Another holder has it now (its fencing token differs): left alone.
    TAKEN = -1
    #: Listed stale, renewed since: its heartbeat resumed (a paused process, a prompt left
    #: open). Left alone.
    RESUMED = -2


class AcquireReply(IntEnum):
    """The first item of an acquire's reply: acquire.lua, multi_acquire.lua."""

    #: Taken (or held by this owner already: a re-sent attempt whose reply was lost).
    ACQUIRED = 1
    #: Held by someone else; the second item says how long a waiter may sleep.
    BUSY = 0


class IntervalReply(IntEnum):
    """The first item of the replies of interval_acquire.lua, interval_change.lua,
    rw_acquire.lua, rw_change.lua and semaphore_acquire.lua."""

    #: Taken, or the change (shrink, upgrade, downgrade, unreserve) done.
    DONE = 1
    #: Conflicting holders: the second item says how long a waiter may sleep.
    BUSY = 0
    #: The parent upgradable hold is gone or does not cover the interval (interval_acquire),
    #: or the hold is not held or not in the mode the change needs (interval_change).
    PARENT_GONE = -3
    #: A shrink whose new interval is not inside the held one.
    NOT_INSIDE = -4
    #: An acquire given a call identity (rw_acquire.lua, interval_acquire.lua,
    #: semaphore_acquire.lua) met a hold of that same call identity on the lock: nothing
    #: granted; the second item is the ms that hold has left. Another delivery of one call
    #: must not hold beside it, even where holds share.
    HELD_BY_CALL = -5


class UndoReply(IntEnum):
    """acquire_undo.lua: what a failed acquire attempt (its reply lost) had taken."""

    #: It had taken a claim over: the claim is back as it was.
    CLAIM_RESTORED = 2
    #: It holds the name: the caller releases it.
    HELD = 1
    #: Nothing of this call's.
    NOTHING = 0


def acquire_outcome(reply: Any) -> tuple[int, int]:
    """(code, value) of an acquire script's reply (acquire.lua, rw_acquire.lua,
    interval_acquire.lua, semaphore_acquire.lua): a hold taken is replied as its fencing
    token alone, (1, token) here (``AcquireReply.ACQUIRED``, ``IntervalReply.DONE``); any
    other outcome as a table whose first items are the code and its value.

    The token alone because a table reply costs Redis about 1 µs per call to build, convert
    and collect: a tenth of an uncontended acquire's server time."""
    if isinstance(reply, bytes):
        return 1, int(reply)
    return int(reply[0]), int(reply[1])
