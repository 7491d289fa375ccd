"""The worker-side Request of SingletonTask: frees a run's lock from the worker's main
process when the child that held it can no longer do so itself (hard time limit, revoke
with terminate, child killed), instead of waiting for its lease to run out."""

from __future__ import annotations

import logging
import threading
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request
from kombu.asynchronous import get_event_loop

from .exceptions import LockError
from .handle import HOSTNAME

log = logging.getLogger("celery_singleton_lock.task")

#: Reported once the child has exited.
_CHILD_GONE = (Terminated, WorkerLostError)
#: Without an event loop: seconds after a hard time limit by which the pool has killed the
#: child (it sends SIGTERM, then SIGKILL 0.1 s later).
_KILL_GRACE = 1.0


class SingletonRequest(Request):  # type: ignore[misc]
    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:
            self._release_after_kill()

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        try:
            super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        finally:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback
            if isinstance(exc, _CHILD_GONE):
                self._release_for_child()
            elif isinstance(exc, TimeLimitExceeded):
                self._release_after_kill()

    def _release_after_kill(self) -> None:
        """Past the hard time limit the pool reports the run (on_failure, on_timeout) while its
        child still runs, and only then kills it: freeing the lock now would let another run
        of the key start beside the dying one. Free it once the pool has killed the child."""
        hub = get_event_loop()
        if hub is not None:
            # After the timer callback that kills the child (billiard: on_hard_timeout).
            hub.call_later(0, self._release_for_child)  # type: ignore[no-untyped-call]
        else:
            timer = threading.Timer(_KILL_GRACE, self._release_for_child)
            timer.daemon = True
            timer.start()

    def _release_for_child(self) -> None:
        task = self.task
        if not self.worker_pid:
            return  # no child is known to have run it: there is no holder to match
        try:
            name = task.lock_name(self.args, self.kwargs)
            # The child ran on this machine: its holder record carries this host name.
            released = task.release_holder(
                self.args, self.kwargs, task_id=self.id, pid=self.worker_pid, host=HOSTNAME
            )
        except LockError as exc:
            log.warning("could not free the lock of %s[%s]: %s", task.name, self.id, exc)
            return
        if released:
            log.info("freed lock %r of %s[%s] whose process ended", name, task.name, self.id)
