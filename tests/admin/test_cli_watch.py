"""``locks list --watch`` (a live view until Ctrl-C), group options typed after the
sub-command, and the message of ``python -m celery_singleton_lock`` without a URL."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import IO

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from test_cli import app, hold, run_celery, run_plain  # noqa: F401 - app is a fixture

from celery_singleton_lock import LockClient

TIMEOUT = 20.0


class Watch:
    """``python -m celery_singleton_lock ... list --watch`` running with its stdout piped;
    ``round()`` reads the next round's lines."""

    def __init__(self, url: str, prefix: str, *args: str) -> None:
        command = [sys.executable, "-m", "celery_singleton_lock", "--url", url]
        command += ["--prefix", prefix, "list", *args]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(self.process.stdout,))
        self.reader.start()
        self.changed = threading.Condition()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, text: str) -> list[str]:
        """The lines read until one containing ``text``."""
        with self.changed:
            assert self.changed.wait_for(
                lambda: any(text in line for line in self.lines), TIMEOUT
            ), self.lines
            return list(self.lines)

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C: the exit code and stderr."""
        self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=TIMEOUT)
        self.reader.join(TIMEOUT)
        return self.process.returncode, stderr

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def watches() -> Iterator[list[Watch]]:
    started: list[Watch] = []
    yield started
    for watch in started:
        watch.kill()


def test_watch_lists_again_until_ctrl_c(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str, watches: list[Watch]
) -> None:
    watch = Watch(lock_redis_url, lock_prefix, "--watch", "0.2")
    watches.append(watch)
    # Piped: plain lines, one round after another (no screen clearing, no colour).
    first = watch.wait_for("no locks")
    assert any(" 0 lock(s): 0 live, 0 queued, 0 stale, 0 release-delay" in line for line in first)
    lease = hold(lock_client, "watched")
    lines = watch.wait_for("watched ")  # its row, after its round's header
    assert "1 lock(s): 1 live, 0 queued, 0 stale, 0 release-delay" in "\n".join(lines)
    assert any(line.startswith("watched ") and " live " in line for line in lines)
    assert not any("\x1b" in line for line in lines)
    lease.release(delay=30)
    watch.wait_for("1 lock(s): 0 live, 0 queued, 0 stale, 1 release-delay")
    code, stderr = watch.interrupt()
    assert code == 0 and "Traceback" not in stderr, stderr


def test_watch_json_is_one_document_per_line(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str, watches: list[Watch]
) -> None:
    hold(lock_client, "json-watched")
    watch = Watch(lock_redis_url, lock_prefix, "--watch", "0.2", "--json")
    watches.append(watch)
    with watch.changed:
        assert watch.changed.wait_for(lambda: len(watch.lines) >= 2, TIMEOUT)
        rounds = [json.loads(line) for line in watch.lines[:2]]
    assert [[item["name"] for item in found] for found in rounds] == [["json-watched"]] * 2
    code, _ = watch.interrupt()
    assert code == 0


@pytest.mark.parametrize("interval", ["--watch=0", "--watch=0.01", "--watch=soon"])
def test_watch_refuses_a_bad_interval(lock_redis_url: str, lock_prefix: str, interval: str) -> None:
    result = run_plain(lock_redis_url, lock_prefix, "list", interval)
    assert result.exit_code == 2 and "--watch" in result.output


def test_python_dash_m_without_a_url_says_to_pass_one(lock_prefix: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "celery_singleton_lock", "--prefix", lock_prefix, "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 2
    assert "pass --url" in done.stderr and "REDIS_URL" in done.stderr
    assert "app's configuration" not in done.stderr


def test_timeout_after_the_sub_command_wins(app: Celery, lock_client: LockClient) -> None:  # noqa: F811
    @app.task(name="csltest.idle")
    def idle() -> None:
        return None

    node = f"csltest-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    with start_worker(app, pool="threads", concurrency=1, hostname=node, perform_ping_check=False):
        # A lock without a heartbeat whose task its own worker does not run: only asking
        # the worker shows it stale.
        hold(
            lock_client,
            "orphan",
            heartbeat=False,
            owner_info={"task_id": "gone", "task_name": "x", "worker": node},
        )
        deadline = time.monotonic() + TIMEOUT
        while not app.control.inspect(timeout=0.5).ping():
            assert time.monotonic() < deadline, "the worker never answered"

        def orphan(*args: str) -> tuple[str, str]:
            result = run_celery(app, *args)
            found = {d["name"]: (d["state"], d["evidence"]) for d in json.loads(result.stdout)}
            return found["orphan"]

        asked = orphan("--timeout", "0", "list", "--timeout", "2", "--json")
        assert asked == ("stale", f"not active on its worker {node}")
        not_asked = orphan("--timeout", "2", "list", "--timeout", "0", "--json")
        assert not_asked == ("live", "no evidence")
        shown = run_celery(app, "show", "orphan", "--timeout", "0", "--json")
        assert json.loads(shown.stdout)[0]["evidence"] == "no evidence"


def test_on_a_terminal_watch_redraws_in_place_in_colour(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    hold(lock_client, "on-screen")
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    command = [sys.executable, "-m", "celery_singleton_lock", "--url", lock_redis_url]
    command += ["--prefix", lock_prefix, "list", "--watch", "0.2"]
    process = subprocess.Popen(command, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    try:
        screen = b""
        deadline = time.monotonic() + TIMEOUT
        while screen.count(b"on-screen") < 2:  # two rounds drawn
            assert time.monotonic() < deadline, screen
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                screen += os.read(leader, 65536)
        assert screen.count(b"\x1b[2J") >= 2  # the screen cleared before each round
        assert b"\x1b[32m" in screen  # "live" in green
        process.send_signal(signal.SIGINT)
        assert process.wait(TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
