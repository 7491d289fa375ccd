"""The rule a restarted worker frees its previous life's holds by, on a real Redis with real
holder processes: its own node, this host, a process that is gone — never a hold whose process
still runs (even paused), another node's, a queued claim or a release delay.

Then real ``celery worker`` programs in pid namespaces of their own (``unshare``: containers
of one host name): a pid proves a holder gone only in the namespace it was recorded in, so a
worker of the same node name in another namespace frees nothing of a live one's, and a solo
worker that is pid 1 in every life still frees its previous life's hold as it starts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.worker_app import make_app
from support.foreign_keys import plant_foreign_keys
from support.waiting import wait_for
from support.workers import WorkerProgram, WorkerPrograms

from celery_singleton_lock import LockClient
from celery_singleton_lock.celery.previous_life import PREVIOUS_LIFE, free_previous_life
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.core.keys import lock_keys

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
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


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


# -- workers of one node name in other pid namespaces --------------------------------------------

#: Runs a command as pid 1 of a pid namespace of its own, with a /proc of that namespace: a
#: container's first process, on this host name (no UTS namespace: host networking).
UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")
#: A restart is tried only while long_lease's 60 s lease (tests/apps/worker_app.py) has at
#: least this long left (ms): well over a worker's start.
MARGIN_MS = 20_000


def unshare_or_skip() -> tuple[str, ...]:
    """:data:`UNSHARE` with its full path, or skip the test where it cannot run."""
    path = shutil.which(UNSHARE[0])
    if path is None:
        pytest.skip("no unshare(1) to start a worker in a pid namespace of its own")
    tried = subprocess.run([path, *UNSHARE[1:], "true"], capture_output=True)
    if tried.returncode != 0:
        pytest.skip(f"unshare --pid is not allowed here: {tried.stderr.decode().strip()}")
    return (path, *UNSHARE[1:])


@pytest.fixture
def programs(lock_redis_url: str, lock_prefix: str, tmp_path: Path) -> Iterator[WorkerPrograms]:
    workers = WorkerPrograms(
        "apps.worker_app", make_app, lock_redis_url, lock_prefix, tmp_path, "default"
    )
    yield workers
    workers.close()


def inner_pid_of(unshare_pid: int) -> int:
    """The host pid of the process that ``unshare`` (``unshare_pid``) runs as pid 1 of its
    namespace."""
    path = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children")
    children = wait_for(lambda: path.read_text().split(), TIMEOUT, "unshare to fork")
    return int(children[0])


def inner_pid(worker: WorkerProgram) -> int:
    """The host pid of the worker that ``unshare`` runs as pid 1 of its namespace."""
    return inner_pid_of(worker.pid)


def ready_in_log(worker: WorkerProgram) -> None:
    """Until ``worker`` says it is ready (a ping cannot tell two workers of one node name
    apart); its start-up clean-up ran before."""
    wait_for(lambda: " ready." in worker.log_text(), TIMEOUT, f"{worker.name} to be ready")


class Namespaces:
    """Makes the next ``unshare --pid --fork --mount-proc`` get a given pid namespace inode
    number, once it is free: as a container restarted on a quiet host does.

    The kernel gives a new namespace (of any type: the mount namespace of ``--mount-proc``
    first, then the pid namespace) the lowest free number, and frees a namespace's number a
    moment after its last process is reaped (after an RCU grace period). So fillers, each a
    process alone in a pid namespace (``unshare --pid --fork sleep``), take every free
    number below the wanted one but those of the last life, and a new life is let run only
    once its namespace has the wanted number (``sh`` waits on a FIFO as its pid 1, then
    execs the worker). Every filler is killed at :meth:`close`."""

    def __init__(self, unshare: tuple[str, ...], fifo: Path) -> None:
        self.unshare = unshare
        self.fifo = fifo
        os.mkfifo(fifo)
        self.fillers: list[subprocess.Popen[bytes]] = []

    @property
    def gated(self) -> tuple[str, ...]:
        """The wrapper of a life that waits, as pid 1 of its namespace, for :meth:`let_run`."""
        return (*self.unshare, "sh", "-c", 'read go < "$0" && exec "$@"', str(self.fifo))

    def fill_below(self, number: int, keep_free: set[int]) -> None:
        """Until a filler gets a number above ``number``: every one below it is taken, but
        those of ``keep_free``, which a filler that gets one gives back."""
        while True:
            filler = subprocess.Popen(
                [self.unshare[0], "--pid", "--fork", "sleep", "600"], stderr=subprocess.DEVNULL
            )
            self.fillers.append(filler)
            got = os.stat(f"/proc/{inner_pid_of(filler.pid)}/ns/pid").st_ino
            if got in keep_free:
                self.stop(filler)
            elif got > number:
                return

    def let_run(self) -> None:
        """Let the life waiting on the FIFO exec its worker."""
        with self.fifo.open("w") as gate:
            gate.write("go\n")

    def stop(self, filler: subprocess.Popen[bytes]) -> None:
        os.kill(inner_pid_of(filler.pid), signal.SIGKILL)  # unshare reaps it and exits
        filler.wait(TIMEOUT)
        self.fillers.remove(filler)

    def close(self) -> None:
        for filler in list(self.fillers):
            self.stop(filler)


def lock_key(programs: WorkerPrograms, key: str) -> bytes:
    return lock_keys(programs.prefix, f"job:{key}").lock


def holder_of(programs: WorkerPrograms, key: str) -> dict[bytes, bytes]:
    return flatten(programs.redis.hgetall(lock_key(programs, key)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("namespaced", ["first", "second"])
def test_a_worker_of_the_same_node_name_in_another_pid_namespace_frees_nothing_at_start(
    programs: WorkerPrograms, namespaced: str
) -> None:
    # Two workers `-n twin@%h` on one host name, one of them in a container of its own
    # (host networking): the second starts while the first runs a call with a live
    # heartbeat. The holder's pid was taken in another pid namespace than the second's:
    # whether the second sees such a pid says nothing. It must neither free the hold nor
    # run a second call of the key beside the first.
    wrapper = unshare_or_skip()
    first_queue, second_queue = programs.queue("first"), programs.queue("second")
    first = programs.launch(
        "twin", [first_queue], concurrency=1, wrapper=wrapper if namespaced == "first" else ()
    )
    programs.wait_ready(first)
    task = programs.app.tasks["worker_app.long_lease"]
    running = task.apply_async(("twin", 600), queue=first_queue)
    started = programs.wait_record(event="start", task_id=running.id)
    holder = holder_of(programs, "twin")
    assert holder[b"task_id"] == running.id.encode() and int(holder[b"pid"]) == started["pid"]

    second = programs.launch(
        "twin", [second_queue], concurrency=1, wrapper=wrapper if namespaced == "second" else ()
    )
    assert second.name == first.name
    ready_in_log(second)

    # A second call of the key, on the second worker: the first still holds it.
    again = task.apply_async(("twin", 0), queue=second_queue)
    done = programs.wait_record(task_id=again.id)
    assert done["event"] == "skipped", f"ran beside the first: {done}"
    assert not programs.records(event="start", task_id=again.id)
    assert not programs.records(event="end", task_id=running.id)  # the first still runs
    assert holder_of(programs, "twin").get(b"owner") == holder[b"owner"]
    # The second says once why it left the hold alone.
    assert "left by a previous life" not in second.log_text()
    assert second.log_text().count("not freed at start") == 1


@pytest.mark.timeout(150)
def test_a_solo_worker_restarted_as_pid_1_of_a_container_frees_its_previous_life_at_start(
    programs: WorkerPrograms, tmp_path: Path
) -> None:
    # A solo worker is pid 1 of its container in every life. Its previous life's hold
    # names pid 1, which runs again (the new life): only the start time tells them apart.
    wrapper = unshare_or_skip()
    queue = programs.queue("reborn")
    life = programs.launch("reborn", [queue], pool="solo", concurrency=1, wrapper=wrapper)
    programs.wait_ready(life)
    running = programs.app.tasks["worker_app.long_lease"].apply_async(("reborn", 600), queue=queue)
    started = programs.wait_record(event="start", task_id=running.id)
    holder = holder_of(programs, "reborn")
    assert started["pid"] == int(holder[b"pid"]) == 1
    first_ns = os.stat(f"/proc/{inner_pid(life)}/ns/pid").st_ino
    first_mnt = os.stat(f"/proc/{inner_pid(life)}/ns/mnt").st_ino

    os.kill(inner_pid(life), signal.SIGKILL)  # unshare, the container runtime, reaps it
    life.process.wait(TIMEOUT)

    # Restarted the same way under the same node name, in a pid namespace with the inode
    # of the last life's (see Namespaces). Such an inode is unique among live namespaces, so
    # the new life knows the last one is over, and that a pid 1 of another start time was
    # the last life's; a life in a namespace of another inode knows nothing of its pids
    # (test_a_worker_of_the_same_node_name_in_another_pid_namespace_frees_nothing_at_start).
    key = lock_key(programs, "reborn")
    namespaces = Namespaces(wrapper, tmp_path / "gate")
    try:
        while True:
            # Long before the lease runs out: only the start-up can free it.
            if programs.redis.pttl(key) < MARGIN_MS:
                pytest.skip("no restart got the pid namespace inode of the first life")
            namespaces.fill_below(first_ns, keep_free={first_ns, first_mnt})
            life = programs.launch(
                "reborn", [queue], pool="solo", concurrency=1, wrapper=namespaces.gated
            )
            if os.stat(f"/proc/{inner_pid(life)}/ns/pid").st_ino == first_ns:
                break
            life.kill()
        namespaces.let_run()
        programs.wait_ready(life)
    finally:
        namespaces.close()

    # Freed as it started (before it answered a ping), not by its lease.
    assert not programs.redis.exists(key)
    assert f"'job:reborn' held by worker_app.long_lease[{running.id}]" in life.log_text()
    assert "left by a previous life of worker" in life.log_text()
