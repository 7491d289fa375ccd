"""Real ``celery worker`` programs of a test app (``apps/worker_app.py``, ``apps/pool_app.py``)
on the test Redis, and the records their tasks leave there (``apps/recording.py``).

Every program runs in its own process group and is SIGKILLed, children and all, at
:meth:`WorkerPrograms.close`. The test process builds a twin of the app (same tasks) to send
the tasks and read what they recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from apps.recording import records_key
from celery import Celery
from celery.utils.nodenames import host_format

from celery_singleton_lock.celery.app_client import close_lock_client

from .waiting import start_celery_worker, wait_for

TIMEOUT = 30.0
#: How long a worker may take to answer its first ping.
START_TIMEOUT = 60.0


@dataclass
class WorkerProgram:
    """One ``celery worker`` program: a main process (and its pool's children, for prefork),
    in a process group of its own."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    queues: tuple[str, ...]
    pool: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL the whole process group: the main process and its pool children."""
        with contextlib.suppress(ProcessLookupError):  # all of the group exited already
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(TIMEOUT)


class WorkerPrograms:
    """Workers of the app module ``app_module`` (``apps.<name>``) on the Redis at ``url``
    under the lock ``prefix``, and the twin app ``make_app(url, prefix, queue)`` whose
    default queue is this set's queue ``default_queue``."""

    def __init__(
        self,
        app_module: str,
        make_app: Callable[[str, str, str], Celery],
        url: str,
        prefix: str,
        log_dir: Path,
        default_queue: str,
    ) -> None:
        self.app_module = app_module
        self.url = url
        self.prefix = prefix
        self.tag = uuid.uuid4().hex[:8]
        self.log_dir = log_dir
        self.app: Celery = make_app(url, prefix, self.queue(default_queue))
        self.redis = redis.Redis.from_url(url)
        self.workers: list[WorkerProgram] = []

    def queue(self, name: str) -> str:
        """A queue of this set (not under the lock prefix: queues never expire)."""
        return f"csltest-{self.tag}-{name}"

    def launch(
        self,
        label: str,
        queues: Sequence[str],
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        wrapper: Sequence[str] = (),
    ) -> WorkerProgram:
        """Start a worker consuming ``queues`` (the first is its app's default queue), with
        ``env`` added to this process's environment and ``args`` to its options, run by the
        command ``wrapper`` if one is given (see ``start_celery_worker``)."""
        log = self.log_dir / f"{label}-{self.tag}.log"
        node = f"{label}-{self.tag}@%h"
        environment = {
            **os.environ,
            "CSL_WORKER_REDIS_URL": self.url,
            "CSL_WORKER_PREFIX": self.prefix,
            "CSL_WORKER_QUEUE": queues[0],
            **(env or {}),
        }
        process = start_celery_worker(
            self.app_module, queues=queues, name=node, env=environment, log=log,
            concurrency=concurrency, pool=pool, args=args, wrapper=wrapper,
        )  # fmt: skip
        worker = WorkerProgram(host_format(node), process, log, tuple(queues), pool)
        self.workers.append(worker)
        return worker

    def wait_ready(self, *workers: WorkerProgram, timeout: float = START_TIMEOUT) -> None:
        """Until every one of ``workers`` answers a ping; fails if one exits first."""
        deadline = time.monotonic() + timeout
        pending = {worker.name: worker for worker in workers}
        while pending:
            for worker in pending.values():
                if worker.process.poll() is not None:
                    pytest.fail(
                        f"worker {worker.name} exited ({worker.process.returncode}):\n"
                        f"{worker.log_text()[-3000:]}"
                    )
            for reply in self.app.control.ping(destination=list(pending), timeout=0.5):
                for name in reply:
                    pending.pop(name, None)
            if pending and time.monotonic() > deadline:
                pytest.fail(f"workers {sorted(pending)} did not answer within {timeout} s")

    def close(self) -> None:
        """Kill every worker, delete the broker's keys of this set's queues (bindings,
        lists: they never expire) and close the Redis connections."""
        for worker in self.workers:
            worker.kill()
        self.workers.clear()
        for key in self.redis.scan_iter(match=f"*csltest-{self.tag}-*", count=1000):
            self.redis.delete(key)
        close_lock_client(self.app)
        self.redis.close()

    def records(self, **match: Any) -> list[dict[str, Any]]:
        """The records the tasks made whose fields equal ``match``, in the order made."""
        entries = [json.loads(raw) for raw in self.redis.lrange(records_key(self.prefix), 0, -1)]
        return [entry for entry in entries if all(entry.get(k) == v for k, v in match.items())]

    def wait_record(self, timeout: float = TIMEOUT, **match: Any) -> dict[str, Any]:
        """The first record whose fields equal ``match``, once there is one."""
        found = wait_for(lambda: self.records(**match), timeout, f"a record with {match}")
        return found[0]
