"""Whether a pid read from a record (a holder hash, a wait mark) still names the process that
wrote it: the one rule by which a pid may prove a holder dead.

A pid means something only inside the pid namespace, and the boot, it was taken in: two
containers of one machine (host networking: one host name) each have their pid 1, and two
machines of one name share nothing at all. Inside its namespace a pid is reused, too: pid 1
of a container's next life, a busy machine's wrapped pid counter. So a record carries, beside
the pid, a :class:`ProcessMark`: the boot id, the inodes of the pid and time namespaces, and
the process's start time (clock ticks since boot, field 22 of ``/proc/<pid>/stat``; the time
namespace is part of the mark because its boot-time offset shifts that field).

:func:`judge` says :data:`GONE` only when the record was made in this boot and these
namespaces and no such process runs now, or the one that has the pid started at another time;
:data:`ALIVE` when the very process still runs; :data:`UNKNOWN` whenever it cannot be sure (a
record of another namespace or boot, or without a mark; no usable ``/proc``, as off Linux).
An unknown holder is left to its heartbeat and lease. A namespace's inode number is unique
among the namespaces alive at one time, so a record naming this namespace's inode was made
either here or in a namespace that is over, whose processes are all gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

#: What :func:`judge` says of a recorded pid.
ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: Hex digits of the boot id a mark keeps: enough to tell boots (and machines) apart.
BOOT_ID_DIGITS = 12
#: ``/proc/<pid>/stat``'s fields after ``(comm)``: state is field 3, starttime field 22.
_STATE, _START = 0, 22 - 3


@dataclass(frozen=True)
class ProcessMark:
    """Where and when a process ran: what makes its pid evidence (see the module)."""

    boot: str
    pid_ns: int
    #: 0 on a kernel without time namespaces.
    time_ns: int
    #: Clock ticks since boot.
    start: int

    def text(self) -> str:
        """The mark as stored: ``<boot>:<pid ns>:<time ns>:<start>``."""
        return f"{self.boot}:{self.pid_ns}:{self.time_ns}:{self.start}"

    @classmethod
    def parse(cls, raw: str | bytes | None) -> ProcessMark | None:
        """The mark stored as ``raw``; None for none, or one that does not read as a mark (a
        record of a later layout says nothing rather than something wrong)."""
        if isinstance(raw, bytes):
            raw = raw.decode(errors="replace")
        if not raw:
            return None
        parts = raw.split(":")
        if len(parts) != 4 or not parts[0]:
            return None
        try:
            return cls(parts[0], int(parts[1]), int(parts[2]), int(parts[3]))
        except ValueError:
            return None

    def same_place(self, other: ProcessMark) -> bool:
        """Whether ``other`` was taken in the boot and namespaces of this one, where the pids
        and start times of the two say the same thing."""
        return (self.boot, self.pid_ns, self.time_ns) == (other.boot, other.pid_ns, other.time_ns)


@dataclass(frozen=True)
class Seen:
    """What this process sees of a pid in its own namespace."""

    exists: bool
    #: It has exited and runs no code (a killed worker's children stay zombies until reaped,
    #: which a container's first process may never do).
    zombie: bool = False
    #: Its start time (clock ticks since boot); None if it could not be read.
    start: int | None = None


NO_SUCH_PROCESS = Seen(exists=False)


def judge(
    pid: int | None,
    recorded: ProcessMark | None,
    here: ProcessMark | None,
    look: Callable[[int], Seen],
) -> str:
    """Whether process ``pid`` that made a record marked ``recorded`` is :data:`ALIVE`,
    :data:`GONE` or :data:`UNKNOWN`, asked by a process marked ``here`` (None: it cannot
    mark itself) that sees a pid of its namespace as ``look`` says. No I/O of its own."""
    if pid is None or recorded is None or here is None or not recorded.same_place(here):
        return UNKNOWN
    if pid < 1:  # not a process's pid (kill() would take it for a process group)
        return UNKNOWN
    seen = look(pid)
    if not seen.exists or seen.zombie:
        return GONE
    if seen.start is None:
        return UNKNOWN  # it exists, and may be the very process
    return ALIVE if seen.start == recorded.start else GONE


# -- this machine ------------------------------------------------------------------------------


def look(pid: int) -> Seen:
    """What this process sees of ``pid`` in its own pid namespace."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return NO_SUCH_PROCESS
    except OSError:  # it exists, under another user
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = _stat_fields(stat.read())
    except OSError:
        # It exited just now, or /proc hides it (hidepid): only the first is certain.
        if _proc_is_ours() and not os.path.exists(f"/proc/{pid}"):
            return NO_SUCH_PROCESS
        return Seen(True)
    if fields is None:
        return Seen(True)
    return Seen(True, zombie=fields[_STATE] == b"Z", start=_int(fields[_START]))


def this_process() -> ProcessMark | None:
    """This process's mark; None where it cannot be made (no Linux ``/proc``, or one that
    shows another pid namespace's pids than this process's). Made once per process."""
    pid = os.getpid()
    if _This.pid != pid:
        _This.mark, _This.pid = _mark_of_this_process(), pid
    return _This.mark


def this_process_text() -> str | None:
    """:func:`this_process` as stored, or None."""
    mark = this_process()
    return None if mark is None else mark.text()


def this_place_text() -> str:
    """How the stored mark of every process in this process's boot and pid and time
    namespaces begins, its last ``:`` included ('' where this process has no mark): what a
    supervisor knows of its child's mark (a forked child shares its parent's namespaces)."""
    mark = this_process()
    return "" if mark is None else f"{mark.boot}:{mark.pid_ns}:{mark.time_ns}:"


class _This:
    """This process's mark, once made; forgotten in a forked child."""

    pid: int | None = None
    mark: ProcessMark | None = None

    @classmethod
    def forget(cls) -> None:
        cls.pid, cls.mark = None, None


def _mark_of_this_process() -> ProcessMark | None:
    if not _proc_is_ours():
        return None
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as boot_id:
            boot = boot_id.read().strip().replace("-", "")[:BOOT_ID_DIGITS]
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
        with open("/proc/self/stat", "rb") as stat:
            fields = _stat_fields(stat.read())
    except OSError:
        return None
    try:
        time_ns = os.stat("/proc/self/ns/time").st_ino
    except OSError:  # a kernel without time namespaces: start times are not shifted
        time_ns = 0
    start = None if fields is None else _int(fields[_START])
    if not boot or start is None:
        return None
    return ProcessMark(boot, pid_ns, time_ns, start)


def _proc_is_ours() -> bool:
    """Whether ``/proc`` shows this process's pid namespace (``unshare --pid`` without a
    new ``/proc`` leaves the parent namespace's there, whose pids are not ours)."""
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def _stat_fields(raw: bytes) -> list[bytes] | None:
    """The fields of a ``/proc/<pid>/stat`` after ``(comm)``, which may hold spaces and
    parentheses (so after the last ``)``); None if there are too few."""
    fields = raw.rpartition(b")")[2].split()
    return fields if len(fields) > _START else None


def _int(raw: bytes) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


os.register_at_fork(after_in_child=_This.forget)
