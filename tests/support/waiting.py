"""Small helpers the process and worker tests share: poll a condition with a deadline, wait
until a blocked acquirer has subscribed, and start a ``celery worker`` subprocess."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from celery_singleton_lock import LockClient

T = TypeVar("T")

#: The tests folder: worker subprocesses run there, so ``-A apps.<module>`` imports.
TESTS = Path(__file__).resolve().parent.parent


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def wait_for_subscriber(client: LockClient, channel: bytes, timeout: float = 10.0) -> None:
    """Until a waiter has subscribed to ``channel`` (it is then blocked inside acquire)."""
    wait_for(
        lambda: dict(client.redis.pubsub_numsub(channel)).get(channel, 0) >= 1,
        timeout,
        "the waiter to subscribe",
    )


def start_celery_worker(
    app_module: str,
    *,
    queues: Sequence[str],
    name: str,
    env: Mapping[str, str],
    log: Path,
    concurrency: int = 2,
    pool: str = "prefork",
    args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """A ``celery worker`` (``pool``: prefork unless told; ``args``: more of its options) in
    its own session, so the test can kill the whole process group; its output goes to
    ``log``. ``wrapper``: a command that runs it (``unshare --pid --fork``: in a pid namespace
    of its own)."""
    command = [*wrapper, sys.executable, "-m", "celery", "-A", app_module, "worker", "-P", pool]
    command += ["-c", str(concurrency), "-Q", ",".join(queues), "-n", name, "-l", "INFO"]
    command += ["--without-heartbeat", "--without-mingle", "--without-gossip", *args]
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            cwd=TESTS,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class BackgroundAcquire:
    """``handle.acquire(wait=wait)`` on a thread of its own, started at once: ``done`` is set
    when it returns or raises; ``results`` / ``errors`` hold what it did."""

    def __init__(self, handle: Any, wait: float) -> None:
        self.done = threading.Event()
        self.results: list[bool] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(handle, wait), daemon=True)
        self.thread.start()

    def _run(self, handle: Any, wait: float) -> None:
        try:
            self.results.append(handle.acquire(wait=wait))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.errors.append(exc)
        self.done.set()

    def finish(self, timeout: float) -> None:
        """Wait for the acquire to end (AssertionError after ``timeout`` s)."""
        assert self.done.wait(timeout), "the background acquire did not return"
        self.thread.join(5)
