"""core/pid_evidence.py: when a pid read from a record proves its process gone. The rule
itself, on given observations; then the marks real processes of this machine make, in this
pid namespace and in another one, and the mark every lock kind's holder record keeps."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.pid_evidence import (
    ALIVE,
    GONE,
    NO_SUCH_PROCESS,
    UNKNOWN,
    ProcessMark,
    Seen,
    judge,
    look,
    this_process,
)

HERE = ProcessMark(boot="b007b007b007", pid_ns=4026531836, time_ns=4026531834, start=100)
#: A holder's mark in this boot and these namespaces, started at tick 5000.
RECORDED = ProcessMark(HERE.boot, HERE.pid_ns, HERE.time_ns, start=5000)


def verdict(
    recorded: ProcessMark | None,
    seen: Seen,
    *,
    pid: int | None = 42,
    here: ProcessMark | None = HERE,
) -> str:
    """The rule on a record of ``pid`` marked ``recorded``, asked by a process marked
    ``here`` that sees that pid as ``seen``."""
    return judge(pid, recorded, here, lambda _pid: seen)


def test_same_namespace_and_start_time_is_alive() -> None:
    assert verdict(RECORDED, Seen(True, start=5000)) == ALIVE


def test_same_namespace_and_another_start_time_is_gone() -> None:
    # The pid was reused: pid 1 of a container's next life, a wrapped pid counter.
    assert verdict(RECORDED, Seen(True, start=7000), pid=1) == GONE


def test_same_namespace_and_no_such_process_or_a_zombie_is_gone() -> None:
    assert verdict(RECORDED, NO_SUCH_PROCESS) == GONE
    assert verdict(RECORDED, Seen(True, zombie=True, start=5000)) == GONE


@pytest.mark.parametrize(
    "recorded",
    [
        ProcessMark(HERE.boot, 4026532178, HERE.time_ns, 5000),  # another pid namespace
        ProcessMark("0ther0b00t00", HERE.pid_ns, HERE.time_ns, 5000),  # another boot, machine
        ProcessMark(HERE.boot, HERE.pid_ns, 4026532200, 5000),  # start times shifted
    ],
)
def test_another_namespace_or_boot_is_unknown_whatever_this_one_sees(
    recorded: ProcessMark,
) -> None:
    for seen in (NO_SUCH_PROCESS, Seen(True, start=7000), Seen(True, start=5000)):
        assert verdict(recorded, seen) == UNKNOWN


def test_missing_fields_are_unknown() -> None:
    assert verdict(None, NO_SUCH_PROCESS) == UNKNOWN  # no mark recorded (an older holder)
    assert verdict(RECORDED, NO_SUCH_PROCESS, pid=None) == UNKNOWN  # no pid recorded
    assert verdict(RECORDED, NO_SUCH_PROCESS, pid=0) == UNKNOWN  # no process's pid
    # This process cannot mark itself (not Linux, a /proc of another namespace).
    assert verdict(RECORDED, NO_SUCH_PROCESS, here=None) == UNKNOWN
    # The process exists and its start time cannot be read (hidepid).
    assert verdict(RECORDED, Seen(True)) == UNKNOWN


def test_a_mark_reads_back_and_a_broken_one_reads_as_none() -> None:
    assert ProcessMark.parse(RECORDED.text()) == RECORDED
    assert ProcessMark.parse(RECORDED.text().encode()) == RECORDED
    for broken in (None, "", b"", "b00:1:2", "b00:1:2:x", ":1:2:3", "a:b:c:d:e"):
        assert ProcessMark.parse(broken) is None


# -- real processes ---------------------------------------------------------------------------

MARK_OF_CHILD = (
    "from celery_singleton_lock.core.pid_evidence import this_process_text\n"
    "import os; print(os.getpid(), this_process_text())"
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="marks need /proc")


@linux_only
def test_this_process_is_alive_and_an_exited_child_is_gone() -> None:
    here = this_process()
    assert here is not None
    assert judge(os.getpid(), here, here, look) == ALIVE
    done = subprocess.run([sys.executable, "-c", MARK_OF_CHILD], check=True, capture_output=True)
    pid, mark = done.stdout.decode().split()
    assert judge(int(pid), ProcessMark.parse(mark), here, look) == GONE


@linux_only
def test_a_pid_of_another_pid_namespace_is_unknown() -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to start a process in a pid namespace of its own")
    done = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", MARK_OF_CHILD],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"unshare --pid is not allowed here: {done.stderr.decode().strip()}")
    pid, mark = done.stdout.decode().split()
    recorded = ProcessMark.parse(mark)
    here = this_process()
    assert pid == "1" and recorded is not None and here is not None
    assert recorded.boot == here.boot and recorded.pid_ns != here.pid_ns
    # Pid 1 runs here too; its number says nothing of the process that recorded it.
    assert judge(1, recorded, here, look) == UNKNOWN


@linux_only
def test_every_kind_records_the_mark_of_its_holders_process(lock_client: LockClient) -> None:
    handles = [
        lock_client.lease("mark-lease", heartbeat=False),
        lock_client.multi(["mark-m1", "mark-m2"], heartbeat=False),
        lock_client.rwlock("mark-rw").read(heartbeat=False),
        lock_client.range_lock("mark-range").write(0, 1, heartbeat=False),
        lock_client.semaphore("mark-sem", 2).permit(heartbeat=False),
    ]
    for handle in handles:
        assert handle.acquire()
    try:
        listed = lock_client.locks("mark-*")
        assert len(listed) == 6
        here = this_process()
        for info in listed:
            assert info.pid == os.getpid() and ProcessMark.parse(info.proc) == here, info
            assert judge(info.pid, ProcessMark.parse(info.proc), here, look) == ALIVE
    finally:
        for handle in handles:
            handle.release()
