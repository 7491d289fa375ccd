"""A worker that comes back under its node name after a crash frees, as it starts, what its
previous life held.

systemd and Kubernetes (a StatefulSet keeps the pod's host name) restart a SIGKILLed worker
under the same node name within seconds; the holds it left would otherwise block their keys
until their lease runs out. At start the worker step frees each hold recorded by its own node
on this host whose process no longer exists: a process of this host that is gone renews
nothing, so none of these holds has a heartbeat that still runs, however recent its last
renewal (each is still cleared only if not renewed since it was listed). A hold whose process
still exists (a prefork child that outlived its killed parent and still runs its task, or a new
process that reused the pid) is left to its heartbeat or its lease.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from ..admin import LIVE, STALE, LockInfo, clear_listed, list_locks
from ..admin.clear import CLEARED
from ..client import LockClient
from ..kinds.lease import CLAIM_OWNER_PREFIX
from .own_holds import left_by_dead_process, pid_gone

log = logging.getLogger(__name__)

#: The evidence a hold freed here is listed with.
PREVIOUS_LIFE = "its process is gone and its worker restarted"


def left_by_previous_life(
    infos: list[LockInfo], node: str, pid_gone: Callable[[int], bool] = pid_gone
) -> list[LockInfo]:
    """The holds among ``infos`` that worker ``node`` left in a previous life: recorded by that
    node on this host, held by a process (not a queued message's claim, not a release delay)
    that no longer exists."""
    return [
        info.restated(STALE, PREVIOUS_LIFE)
        for info in infos
        if info.state in (LIVE, STALE)
        and not (info.owner or "").startswith(CLAIM_OWNER_PREFIX)
        and left_by_dead_process(
            info.worker, info.host, info.pid, node=node, this_pid=os.getpid(), pid_gone=pid_gone
        )
    ]


def free_previous_life(client: LockClient, node: str) -> list[LockInfo]:
    """Free what worker ``node`` left in a previous life (see the module); the holds freed.
    Each is cleared only if it still has the holder listed and was not renewed since."""
    freed = []
    for info in left_by_previous_life(list_locks(client), node):
        if clear_listed(client, info) == CLEARED:
            freed.append(info)
            log.warning(
                "freed %s %r held by %s[%s] (pid %s): left by a previous life of worker %s",
                info.kind, info.name, info.task_name, info.task_id, info.pid, node,
            )  # fmt: skip
    return freed
