"""The state each run of an app's tasks ended in, as the worker reported it (``task_postrun``),
for tests that count runs and their outcomes."""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery
from celery.signals import task_postrun

TIMEOUT = 60.0


class Outcomes:
    """The state each run of ``app``'s tasks ended in (``task_postrun``), in order."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.states: list[tuple[str, str]] = []
        self.changed = threading.Condition()
        task_postrun.connect(self.record, weak=False)

    def record(self, sender: Any = None, task_id: str = "", state: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            with self.changed:
                self.states.append((task_id, str(state)))
                self.changed.notify_all()

    def wait(self, count: int, timeout: float = TIMEOUT) -> list[str]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.states) >= count, timeout), self.states
            return [state for _, state in self.states]

    def close(self) -> None:
        task_postrun.disconnect(self.record)
