"""Clearing what a listing found, safely: holder-checked and atomic, so a lock taken again
since it was listed is left alone; and releasing what a dead task held, for a supervisor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core import validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.holder import ListedHolder
from ..core.patterns import escape
from ..core.replies import Reply
from ..core.scripts import ScriptCall, ScriptHost
from ..core.steps import Steps
from ..exceptions import ConfigurationError, LockError
from ..kinds.registry import LEASES, family_of
from . import inspect
from .inspect import LIVE, QUEUED, RELEASE_DELAY, STALE, LockInfo

__all__ = [
    "CLEARED", "GONE", "RESUMED", "TAKEN", "clear", "clear_info", "clear_listed",
    "release_holder",
]  # fmt: skip

#: What clearing a listed holder did: the clear scripts' codes (:class:`Reply`, where
#: each is described; CLEARED is its DONE), under the names the admin API has always had
#: for them.
CLEARED, GONE = Reply.DONE, Reply.GONE
TAKEN, RESUMED = Reply.TAKEN, Reply.RESUMED


def clear_info(client: Connection | HasConnection, info: LockInfo) -> bool:
    """Clear the listed holder ``info`` if it still holds (token/owner-checked, atomic), and,
    if it was listed stale, only if it was not renewed since: True if cleared, False if it
    was gone, the name has another holder now, or its heartbeat resumed."""
    return clear_listed(client, info) == CLEARED


def clear_listed(
    client: Connection | HasConnection, info: LockInfo, *, force: bool = False
) -> Reply:
    """Clear the listed holder ``info`` in one atomic step that checks it is still that
    holder (its fencing token) and, unless ``force``, that a holder listed stale is still
    stale: not renewed since it was listed. CLEARED, GONE, TAKEN or RESUMED."""
    conn = connection_of(client)
    return conn.run(listed_cleared(conn, info, force))


def listed_cleared(conn: ScriptHost, info: LockInfo, force: bool) -> Steps[Reply]:
    """:func:`clear_listed`'s steps, for both clients."""
    call = clear_call(conn, info, force)
    if call is None:
        return GONE
    return Reply(int((yield call)))


def clear_call(conn: ScriptHost, info: LockInfo, force: bool) -> ScriptCall | None:
    """The script call that clears the listed holder ``info`` (see :func:`clear_listed`),
    from its family in the kind registry; None for a kind no family has."""
    # The renewal is checked only for a holder listed stale, unless forced.
    renewed = info.renewed_ms if info.state == STALE and not force else None
    holder = ListedHolder(
        info.name, info.kind, owner=info.owner or "", token=info.token, renewed_ms=renewed
    )
    if info.state == RELEASE_DELAY and info.kind in ("lease", "multi"):
        return LEASES.clear_call(conn, holder)  # an ownerless hash on a lease key
    family = family_of(info.kind)
    return None if family is None else family.clear_call(conn, holder)


def clear(
    client: Connection | HasConnection,
    name: str,
    *,
    token: int | None = None,
    force: bool = False,
) -> bool:
    """Clear every holder of lock ``name`` (only the one with fencing ``token``, if given).

    Refuses, clearing nothing, with :class:`LockError` if one of them is live (its
    heartbeat is fresh, or it has no heartbeat) or a claim listed queued, and ``force`` is
    false. Returns True if something was cleared; a lock re-acquired since it was read is
    left alone. Without ``force``, a holder read as stale whose heartbeat resumed before the
    clear is left alone too, and :class:`LockError` says so (after the other holders were
    cleared).
    """
    conn = connection_of(client)
    return conn.run(name_cleared(conn, name, token, force))


def name_cleared(conn: ScriptHost, name: str, token: int | None, force: bool) -> Steps[bool]:
    """:func:`clear`'s steps, for both clients."""
    name = validate.check_name(name)
    token = validate.check_optional_token(token)
    force = validate.check_bool(force, "force")
    infos = to_clear((yield from inspect.listing(conn.prefix, escape(name))), name, token, force)
    codes = []
    for info in infos:
        codes.append((yield from listed_cleared(conn, info, force)))
    return cleared(name, codes)


def to_clear(infos: list[LockInfo], name: str, token: int | None, force: bool) -> list[LockInfo]:
    """The listed holders of lock ``name`` (with fencing ``token``, if given) that
    :func:`clear` clears; :class:`LockError` if one is live and not ``force``."""
    infos = [info for info in infos if info.name == name and (token is None or info.token == token)]
    live = [info for info in infos if info.state in (LIVE, QUEUED)]
    if live and not force:
        raise LockError(
            f"lock {name!r} is {live[0].state} ({live[0].evidence}); clear it with force=True",
            name=name,
        )
    return infos


def cleared(name: str, codes: Sequence[int]) -> bool:
    """What :func:`clear` of lock ``name`` returns for the clear ``codes`` of its holders;
    :class:`LockError` if one was left alone because its heartbeat resumed."""
    if RESUMED in codes:
        raise LockError(
            f"lock {name!r} left alone: heartbeat resumed since it was listed stale", name=name
        )
    return CLEARED in codes


def release_holder(
    client: Connection | HasConnection,
    kind: str,
    name: Any,
    *,
    task_id: str,
    pid: int,
    host: str | None = None,
    delay: float = 0.0,
) -> bool:
    """Release (after a release delay of ``delay`` seconds) what task ``task_id`` running in
    process ``pid`` on ``host`` (default: this machine) holds of the ``kind`` lock ``name``
    (for ``multi``: a collection of names); for a supervisor whose child can no longer
    release. True if something was released."""
    family = family_of(kind)
    if family is None:
        kinds = ", ".join(inspect.KINDS)
        raise ConfigurationError("kind", f"must be one of {kinds}, got {kind!r}")
    return family.release_holder(
        connection_of(client), name, task_id=task_id, pid=pid, host=host, delay=delay
    )
