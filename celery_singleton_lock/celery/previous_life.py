"""A worker that comes back under its node name after a crash frees, as it starts, what its
previous life held.

systemd and Kubernetes (a StatefulSet keeps the pod's host name) restart a SIGKILLed worker
under the same node name within seconds; the holds it left would otherwise block their keys
until their lease runs out. At start the worker step frees each hold recorded by its own node
on this host whose process is provably gone: recorded in this boot and this pid namespace
(the holder's ``proc`` mark, core/pid_evidence.py), and no process with that pid and start
time runs now. A process that is gone renews nothing, so none of these holds has a heartbeat
that still runs, however recent its last renewal (each is still cleared only if not renewed
since it was listed). A hold whose process still runs (a prefork child that outlived its
killed parent and still runs its task) is left to its heartbeat or its lease.

A pid proves nothing outside the namespace and boot it was read in: another worker of the
same node name may run in another container of this host name (host networking), or on
another machine of that name, and hold its keys with a live heartbeat. So a hold recorded in
another pid namespace or boot, or without a mark (a holder of an older version, not Linux),
is not freed here; it goes by its heartbeat or its lease. The pid of a process that reused it
(pid 1 of a container's next life, if that life's pid namespace has the inode of the last
one) is told apart by its start time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..admin import LIVE, STALE, LockInfo, clear_listed, list_locks
from ..admin.clear import CLEARED
from ..client import LockClient
from ..core.holder import HOSTNAME
from ..core.pid_evidence import GONE, UNKNOWN
from ..kinds.lease import CLAIM_OWNER_PREFIX
from .own_holds import process_state

log = logging.getLogger(__name__)

#: The evidence a hold freed here is listed with.
PREVIOUS_LIFE = "its process is gone and its worker restarted"


def held_by_node(infos: list[LockInfo], node: str) -> list[LockInfo]:
    """The holds among ``infos`` recorded by worker ``node`` on this host and held by a
    process: not a queued message's claim, not a release delay."""
    return [
        info
        for info in infos
        if info.state in (LIVE, STALE)
        and not (info.owner or "").startswith(CLAIM_OWNER_PREFIX)
        and info.worker == node
        and info.host == HOSTNAME
    ]


def left_by_previous_life(
    infos: list[LockInfo],
    node: str,
    process: Callable[[int | None, str | None], str] = process_state,
) -> tuple[list[LockInfo], list[LockInfo]]:
    """The holds among ``infos`` that worker ``node`` left in a previous life (their process
    is provably gone, by ``process``), restated stale; and the holds of ``node`` on this host
    whose process this one cannot judge (another pid namespace or boot, no mark)."""
    gone, unknown = [], []
    for info in held_by_node(infos, node):
        state = process(info.pid, info.proc)
        if state == GONE:
            gone.append(info.restated(STALE, PREVIOUS_LIFE))
        elif state == UNKNOWN:
            unknown.append(info)
    return gone, unknown


def free_previous_life(client: LockClient, node: str) -> list[LockInfo]:
    """Free what worker ``node`` left in a previous life (see the module); the holds freed.
    Each is cleared only if it still has the holder listed and was not renewed since."""
    gone, unknown = left_by_previous_life(list_locks(client), node)
    if unknown:
        # Once per start, not per hold: the operator learns why these stay held.
        log.warning(
            "%d hold(s) of worker %s on this host were recorded in another pid namespace or "
            "boot, or without process evidence: not freed at start, each goes by its "
            "heartbeat or its lease (%s)",
            len(unknown), node, ", ".join(repr(info.name) for info in unknown[:5]),
        )  # fmt: skip
    freed = []
    for info in gone:
        if clear_listed(client, info) == CLEARED:
            freed.append(info)
            log.warning(
                "freed %s %r held by %s[%s] (pid %s): left by a previous life of worker %s",
                info.kind, info.name, info.task_name, info.task_id, info.pid, node,
            )  # fmt: skip
    return freed
