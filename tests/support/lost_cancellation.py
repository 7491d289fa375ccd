"""An asyncio lock connection that loses a cancellation the way redis-py's asyncio client
can, every time rather than now and then.

redis-py sends a command inside ``asyncio.wait_for``; on Python 3.11 and before, a
cancellation that lands just as the send completes is dropped (``wait_for`` returns the
send's result), and the command goes on to wait for its reply as if nobody had cancelled
it: it returns the reply, or runs into the socket's timeout. The task still counts the
cancellation as asked for (``Task.cancelling()``). Here the next script call, after
:meth:`LosingConnection.lose_next_cancellation`, is shielded from the caller's
cancellation: it runs to its end on the real server, whatever the caller asked meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from celery_singleton_lock.aio.connection import AsyncConnection


class LosingConnection(AsyncConnection):
    """An :class:`AsyncConnection` whose next script call, once armed, ignores a
    cancellation (``lost`` is set when one was ignored)."""

    def __init__(self, redis_client: Any, prefix: str) -> None:
        super().__init__(redis_client, prefix)
        self.lost = asyncio.Event()
        self._armed = False

    def lose_next_cancellation(self) -> None:
        self._armed = True

    async def script(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if not self._armed:
            return await super().script(script, keys, args)
        self._armed = False
        call = asyncio.ensure_future(super().script(script, keys, args))
        while True:
            try:
                return await asyncio.shield(call)
            except asyncio.CancelledError:
                if call.cancelled():  # not the caller's: the call itself was cancelled
                    raise
                self.lost.set()
