"""Replicated locks (opt-in): a lock's writes acknowledged by N replicas before a call
reports success.

With ``replicas`` N > 0 every lock script call of every kind (acquire, release, renewal,
hand-over, upgrade, downgrade, shrink, clear), sync or asyncio, is sent with ``WAIT N
timeout`` in the same round trip (a non-transactional pipeline), and a reply acknowledged by
fewer than N replicas raises :class:`LockNotReplicated` after the script ran on the master.
:func:`.scripts.run_batch` (and the asyncio ``run_batch``) adds the WAIT; this module holds
the setting and the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigurationError, LockNotReplicated
from . import validate


@dataclass(frozen=True)
class Replication:
    """How many replicas must acknowledge a lock's write, and for how long the master
    waits for them (``WAIT replicas timeout_ms``)."""

    replicas: int
    timeout_ms: int

    def failed(self, acknowledged: int, replies: list[Any]) -> LockNotReplicated:
        """The error for a write acknowledged by only ``acknowledged`` replicas, with the
        script ``replies`` (the scripts ran on the master)."""
        return LockNotReplicated(
            f"not replicated to {self.replicas} replica(s) within {self.timeout_ms} ms "
            f"({acknowledged} acknowledged)",
            replies=replies,
            acknowledged=acknowledged,
        )


def check_replication(replicas: object, replica_timeout: object) -> Replication | None:
    """The :class:`Replication` of ``replicas`` (an int >= 0) and ``replica_timeout`` (seconds
    > 0), or None for ``replicas=0`` (no WAIT); bad values raise ConfigurationError."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigurationError("replicas", f"must be an int >= 0, got {replicas!r}")
    timeout = validate.check_positive(replica_timeout, "replica_timeout")
    if replicas == 0:
        return None
    return Replication(replicas, validate.seconds_to_ms(timeout))
