"""The rule a restarted worker frees its previous life's holds by, on a real Redis with real
holder processes: its own node, this host, a process that is gone — never a hold whose process
still runs (even paused), another node's, a queued claim or a release delay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from support.foreign_keys import plant_foreign_keys

from celery_singleton_lock import LockClient
from celery_singleton_lock.celery.previous_life import PREVIOUS_LIFE, free_previous_life

NODE = "celery@reborn"
TIMEOUT = 30


class Holders:
    """Holder processes started by a test; each is killed at the end."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.processes: list[subprocess.Popen[str]] = []

    def start(
        self, name: str, *, node: str = NODE, kind: str = "lease", delay: float = 0
    ) -> subprocess.Popen[str]:
        """A process holding ``name`` (``kind``: a lease or a read hold) as a task of worker
        ``node``; with ``delay`` it releases with that release delay first. It says ``held``
        and then waits to be killed."""
        code = textwrap.dedent(f"""
            import sys
            from celery_singleton_lock import LockClient
            client = LockClient.from_url({self.url!r}, prefix={self.prefix!r})
            info = {{"task_id": "t-{name}", "task_name": "job", "worker": {node!r}}}
            if {kind!r} == "read":
                handle = client.rwlock({name!r}).read(ttl=60, owner_info=info)
            else:
                handle = client.lease({name!r}, ttl=60, owner_info=info)
            assert handle.acquire()
            if {delay!r}:
                handle.release(delay={delay!r})
            print("held", flush=True)
            sys.stdin.read()
        """)
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.processes.append(process)
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        return process

    def kill(self, process: subprocess.Popen[str]) -> None:
        process.kill()
        process.wait(TIMEOUT)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.wait(TIMEOUT)


@pytest.fixture
def holders(lock_redis_url: str, lock_prefix: str) -> Iterator[Holders]:
    started = Holders(lock_redis_url, lock_prefix)
    yield started
    started.close()


def held(client: LockClient) -> set[str]:
    return {info.name for info in client.locks()}


def test_only_a_dead_process_of_this_node_on_this_host_is_freed(
    lock_client: LockClient, holders: Holders
) -> None:
    holders.kill(holders.start("dead-lease"))
    holders.kill(holders.start("dead-read", kind="read"))
    paused = holders.start("paused")
    os.kill(paused.pid, signal.SIGSTOP)  # alive, renewing nothing: not ours to judge here
    holders.start("alive")
    holders.kill(holders.start("other-node", node="celery@elsewhere"))
    holders.kill(holders.start("release-delay", delay=60))
    claim = lock_client.lease("claimed", ttl=60, owner="claim:t-claimed:0")
    assert claim.acquire()

    freed = free_previous_life(lock_client, NODE)

    assert sorted(info.name for info in freed) == ["dead-lease", "dead-read"]
    assert all(info.evidence == PREVIOUS_LIFE for info in freed)
    assert held(lock_client) == {"paused", "alive", "other-node", "release-delay", "claimed"}
    # The names are free for the next holder.
    assert lock_client.lease("dead-lease", ttl=5).acquire()
    assert lock_client.rwlock("dead-read").write(ttl=5).acquire()
    # Nothing left to free the second time.
    assert free_previous_life(lock_client, NODE) == []


def test_a_foreign_key_of_another_type_does_not_stop_the_clean_up(
    lock_client: LockClient, lock_prefix: str, holders: Holders
) -> None:
    """The clean-up lists every lock: a key matching a lock key pattern that holds another
    type (a string where a lock hash would be) is skipped, and the dead hold still freed."""
    holders.kill(holders.start("dead-lease"))
    plant_foreign_keys(lock_client, lock_prefix)

    freed = free_previous_life(lock_client, NODE)

    assert [(info.name, info.evidence) for info in freed] == [("dead-lease", PREVIOUS_LIFE)]
    assert lock_client.locks() == [] and lock_client.locks().skipped == 3
