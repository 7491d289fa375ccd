"""The exclusive lease: one holder per name at a time, renewed by the heartbeat."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import arguments
from .handle import LockHandle, RenewEntry
from .keys import FENCE_TTL_MS
from .scripts import ScriptCall

if TYPE_CHECKING:
    from .client import LockClient


class Lease(LockHandle):
    """An exclusive, expiring lock on one name.

    Made by :meth:`LockClient.lease`. ``acquire`` takes it, ``release`` gives it back, and
    while it is held the process's heartbeat renews it every ``ttl / 3`` seconds, so a holder
    that dies frees the name within ``ttl``. Used as a context manager it acquires (waiting up
    to ``wait`` seconds, else raising :class:`LockTimeout`) and releases on exit.
    """

    kind = "lease"

    def __init__(self, client: LockClient, name: str, **options: Any) -> None:
        """Options as for :meth:`LockClient.lease`."""
        super().__init__(client, name, **options)
        self._keys = client._keys(self.name)
        self._channel = self._keys.channel
        # Claims (see claims.py): hold the name as this fixed owner token instead of a fresh
        # one, and/or take over a claim held under this token.
        self._claim_as: str | None = None
        self._takeover = ""

    def _new_owner(self) -> str:
        return self._claim_as or super()._new_owner()

    def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        client = self._client
        return client._call(
            client._scripts.acquire,
            self._keys.lock,
            self._keys.fence,
            owner,
            self._ttl_ms,
            self._max_hold_ms,
            FENCE_TTL_MS,
            self._describe_holder(),
            self._takeover,
            waiting=reserve,
        )

    def _release(self, owner: str, delay_ms: int) -> int:
        client = self._client
        return client._call(
            client._scripts.release, self._keys.lock, owner, delay_ms, self._keys.channel
        )

    @classmethod
    def _renew_script_call(cls, client: LockClient, entries: list[RenewEntry]) -> ScriptCall:
        return client._scripts.renew_call(
            [(lease._keys.lock, owner, ttl_ms) for lease, owner, ttl_ms in entries]
        )

    def _release_holder(self, task_id: str, pid: int, delay: float) -> bool:
        return self._client.release_holder(self.name, task_id=task_id, pid=pid, delay=delay)

    def _hand_over(self, new_owner: str, ttl: float, fields: dict[str, str]) -> None:
        """Pass the held name to ``new_owner`` (a claim) without freeing it in between; this
        handle no longer holds it afterwards. Raises LockLost if it was lost already."""
        owner = self._forget()
        flat = [item for pair in fields.items() for item in pair]
        code = self._client._call(
            self._client._scripts.handover,
            self._keys.lock,
            owner,
            new_owner,
            arguments.seconds_to_ms(ttl),
            flat,
        )
        if code != 1:
            raise self._lost_error(code, "hand over")
