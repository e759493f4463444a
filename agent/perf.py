"""perf_event_open for the agent's CPI counters, the thin I/O part: the syscall through ctypes (libc's `syscall`, with
errno), one counter group per CPU for a cgroup directory (open, enable, read, close; every descriptor closed on
every path, failures included), and `probe()`, which says once at start whether this kernel lets the agent count
hardware events at all, and if not, why.

Called by agent.cpi_collect, from a worker thread (a round opens one descriptor per event, CPU and pod), and by the
tests. The structure layout, decoding, scaling and the meaning of an errno are agent.cpi's.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
from collections.abc import Callable, Sequence
from functools import cache
from types import TracebackType

from agent import cpi

_Syscall = Callable[..., int]


@cache
def _syscall() -> tuple[int, _Syscall] | str:
    """perf_event_open's number and libc's syscall(), or why this machine has neither (looked up on first use, not
    at import: the agent without CPI never loads libc through ctypes)."""
    machine = platform.machine()
    number = cpi.PERF_EVENT_OPEN_SYSCALL.get(machine)
    if number is None:
        return f"no perf_event_open syscall number is known for the {machine} architecture"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syscall
    except (OSError, AttributeError) as e:
        return f"libc's syscall() is not available: {e}"
    function.restype = ctypes.c_long
    return number, function


class PerfUnavailableError(OSError):
    """perf_event_open cannot even be called here (unknown architecture, no libc syscall())."""


def perf_event_open(attr: bytes, *, pid: int, cpu: int, group_fd: int = -1, flags: int) -> int:
    """A new perf event descriptor; OSError carrying the kernel's errno when it refuses."""
    found = _syscall()
    if isinstance(found, str):
        raise PerfUnavailableError(errno.ENOSYS, found)
    number, syscall = found
    buffer = ctypes.create_string_buffer(attr, len(attr))
    fd = syscall(
        ctypes.c_long(number),
        buffer,
        ctypes.c_long(pid),
        ctypes.c_long(cpu),
        ctypes.c_long(group_fd),
        ctypes.c_ulong(flags),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(fd)


def paranoid(proc_root: str = "/proc") -> int | None:
    """kernel.perf_event_paranoid, or None when it cannot be read."""
    try:
        with open(os.path.join(proc_root, "sys/kernel/perf_event_paranoid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def probe(events: Sequence[cpi.Event] = cpi.CPI_EVENTS, *, proc_root: str = "/proc") -> str | None:
    """None when this process may count `events` (as one group, on itself, on any CPU); otherwise why not: the
    errno's name and what it most likely means (agent.cpi.explain_errno). Every descriptor opened is closed."""
    try:
        with CounterGroups.open_self(events):
            return None
    except PerfUnavailableError as e:
        return str(e.strerror)
    except OSError as e:
        return cpi.explain_errno(e.errno or 0, paranoid=paranoid(proc_root))


class CounterGroups:
    """One counter group of `events` (leader first) per CPU, for one cgroup or for this process; `close()` (or the
    `with` block's end) closes every descriptor, whatever happened before."""

    def __init__(self, events: Sequence[cpi.Event]) -> None:
        self.events = tuple(events)
        self._groups: list[list[int]] = []

    @classmethod
    def open_cgroup(cls, cgroup_dir: str, cpus: Sequence[int], events: Sequence[cpi.Event]) -> CounterGroups:
        """A disabled group on each of `cpus` counting the tasks of the cgroup at `cgroup_dir` (which must be a
        directory of a hierarchy with the perf_event controller; a symlink is refused). OSError with the kernel's
        errno (FileNotFoundError: the cgroup is gone) after closing whatever was opened."""
        dir_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            return cls._open(events, pid=dir_fd, cpus=cpus, flags=cpi.PERF_FLAG_PID_CGROUP | cpi.PERF_FLAG_FD_CLOEXEC)
        finally:
            os.close(dir_fd)  # the events hold the cgroup themselves

    @classmethod
    def open_self(cls, events: Sequence[cpi.Event]) -> CounterGroups:
        """A disabled group counting this process on whichever CPU it runs (what `probe` tries)."""
        return cls._open(events, pid=0, cpus=(-1,), flags=cpi.PERF_FLAG_FD_CLOEXEC)

    @classmethod
    def _open(cls, events: Sequence[cpi.Event], *, pid: int, cpus: Sequence[int], flags: int) -> CounterGroups:
        groups = cls(events)
        leader_attr = cpi.attr_bytes(groups.events[0], leader=True)
        member_attrs = [cpi.attr_bytes(event, leader=False) for event in groups.events[1:]]
        try:
            for cpu in cpus:
                group: list[int] = []
                groups._groups.append(group)
                leader = perf_event_open(leader_attr, pid=pid, cpu=cpu, flags=flags)
                group.append(leader)
                for attr in member_attrs:
                    group.append(perf_event_open(attr, pid=pid, cpu=cpu, group_fd=leader, flags=flags))
        except BaseException:
            groups.close()
            raise
        return groups

    @property
    def descriptors(self) -> int:
        return sum(len(group) for group in self._groups)

    def enable(self) -> None:
        """Reset and start every CPU's group."""
        for group in self._groups:
            fcntl.ioctl(group[0], cpi.PERF_EVENT_IOC_RESET, cpi.PERF_IOC_FLAG_GROUP)
            fcntl.ioctl(group[0], cpi.PERF_EVENT_IOC_ENABLE, cpi.PERF_IOC_FLAG_GROUP)

    def read(self) -> list[cpi.GroupRead]:
        """Stop every CPU's group, then read each (OSError, or agent.cpi.PerfReadError for a read the kernel should
        not have written)."""
        for group in self._groups:
            fcntl.ioctl(group[0], cpi.PERF_EVENT_IOC_DISABLE, cpi.PERF_IOC_FLAG_GROUP)
        size = cpi.read_size(len(self.events))
        return [cpi.decode_group_read(os.read(group[0], size), len(self.events)) for group in self._groups]

    def close(self) -> None:
        """Close every descriptor (members before their leader); safe to call again."""
        groups, self._groups = self._groups, []
        for group in groups:
            for fd in reversed(group):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __enter__(self) -> CounterGroups:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
