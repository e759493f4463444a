"""Cycles per instruction (CPI) from perf counters, the pure part: the kernel's `perf_event_attr` as bytes, the
decoding of a counter group's read, scaling for multiplexing, the arithmetic, which pods one round counts, and what a
refused `perf_event_open` most likely means.

Like koordlet's CPICollector, the agent counts two hardware events, cycles (PERF_TYPE_HARDWARE,
PERF_COUNT_HW_CPU_CYCLES) and instructions (PERF_COUNT_HW_INSTRUCTIONS), for a cgroup: one counter group per online
CPU, opened with PERF_FLAG_PID_CGROUP and the cgroup directory's descriptor as `pid`, so the counters run only while
a task of that cgroup runs on that CPU. Cycles lead the group and instructions follow it, so the PMU schedules both
together and their ratio is taken over the same instants even when it multiplexes them with other users' counters.
Each group is read once (PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING): how long it was enabled, how
long it actually counted, and the counts.

Called by agent.perf (the syscalls), agent.cpi_collect (the rounds) and agent.core (the CpiCount a pod sample
carries). Nothing here opens, reads or waits.
"""

from __future__ import annotations

import ctypes
import errno
import struct
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple, TypeVar

import msgspec

# --- the kernel's ABI (include/uapi/linux/perf_event.h)

PERF_TYPE_HARDWARE: Final = 0
PERF_TYPE_SOFTWARE: Final = 1
PERF_COUNT_HW_CPU_CYCLES: Final = 0
PERF_COUNT_HW_INSTRUCTIONS: Final = 1
PERF_COUNT_SW_CPU_CLOCK: Final = 0
PERF_COUNT_SW_TASK_CLOCK: Final = 1
PERF_COUNT_SW_CONTEXT_SWITCHES: Final = 3

PERF_FORMAT_TOTAL_TIME_ENABLED: Final = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING: Final = 1 << 1
PERF_FORMAT_GROUP: Final = 1 << 3
READ_FORMAT: Final = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
"""What a group leader's read returns: u64 nr, u64 time_enabled, u64 time_running, then u64 value[nr]."""

PERF_FLAG_PID_CGROUP: Final = 1 << 2
PERF_FLAG_FD_CLOEXEC: Final = 1 << 3

# _IO('$', n): no argument size, type '$' (0x24)
PERF_EVENT_IOC_ENABLE: Final = 0x2400
PERF_EVENT_IOC_DISABLE: Final = 0x2401
PERF_EVENT_IOC_RESET: Final = 0x2403
PERF_IOC_FLAG_GROUP: Final = 1

PERF_EVENT_OPEN_SYSCALL: Final = {"x86_64": 298, "aarch64": 241}
"""perf_event_open's number by `uname -m` (arch/x86/entry/syscalls/syscall_64.tbl; the generic table for arm64)."""

PERF_ATTR_SIZE_VER8: Final = 136


class PerfEventAttr(ctypes.Structure):
    """`struct perf_event_attr` up to `config3` (PERF_ATTR_SIZE_VER8, Linux 6.3). An older kernel takes the larger
    struct as long as the fields it does not know are zero, which they are here. The flag bits are the low bits of
    one u64, first field first, as GCC lays out the kernel's bitfield on the little-endian machines the agent runs on
    (x86_64, arm64); only the ones the agent sets are named."""

    _fields_ = (
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("disabled", ctypes.c_uint64, 1),
        ("inherit", ctypes.c_uint64, 1),
        ("pinned", ctypes.c_uint64, 1),
        ("exclusive", ctypes.c_uint64, 1),
        ("exclude_user", ctypes.c_uint64, 1),
        ("exclude_kernel", ctypes.c_uint64, 1),
        ("exclude_hv", ctypes.c_uint64, 1),
        ("exclude_idle", ctypes.c_uint64, 1),
        ("other_flags", ctypes.c_uint64, 56),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("reserved_3", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64),
        ("config3", ctypes.c_uint64),
    )


class Event(NamedTuple):
    """A perf event by its `type` and `config`, and the name the logs give it."""

    type: int
    config: int
    name: str


CYCLES: Final = Event(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, "cycles")
INSTRUCTIONS: Final = Event(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, "instructions")
CPI_EVENTS: Final = (CYCLES, INSTRUCTIONS)
"""The group the agent counts, leader first: what koordlet's CPICollector counts."""
TASK_CLOCK: Final = Event(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, "task-clock")
CONTEXT_SWITCHES: Final = Event(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES, "context-switches")
"""Software events every kernel with perf events has, PMU or not: the tests count them through the same cgroup code
on machines without a PMU."""


def attr_bytes(event: Event, *, leader: bool, read_format: int = READ_FORMAT) -> bytes:
    """The `perf_event_attr` of one event of a counting group. The leader starts disabled (the group is enabled at
    once, with PERF_IOC_FLAG_GROUP, when every CPU's group is open) and members follow it. Hypervisor cycles are
    excluded (a guest cannot count them; koordlet's event encoding counts user and kernel only). `inherit` stays off:
    a cgroup counter counts every task of the cgroup on its CPU, children included, without it."""
    attr = PerfEventAttr(
        type=event.type,
        size=PERF_ATTR_SIZE_VER8,
        config=event.config,
        read_format=read_format,
        disabled=1 if leader else 0,
        exclude_hv=1,
    )
    return bytes(attr)


# --- reading a group


class PerfReadError(ValueError):
    """A counter group's read is not what the kernel writes for the group the agent opened."""


class GroupRead(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One CPU's counter group as read: ns enabled, ns actually counting, and the counts in group order."""

    enabled_ns: int
    running_ns: int
    values: tuple[int, ...]


def read_size(events: int) -> int:
    """Bytes of a READ_FORMAT read of a group of `events` counters."""
    return 8 * (3 + events)


def decode_group_read(data: bytes, events: int) -> GroupRead:
    """The read of a group of `events` counters (native byte order, as the kernel writes it); PerfReadError when it
    is short or names another number of counters."""
    if len(data) != read_size(events):
        raise PerfReadError(f"a read of a {events}-counter group is {read_size(events)} bytes, got {len(data)}")
    nr, enabled, running, *values = struct.unpack(f"={3 + events}Q", data)
    if nr != events:
        raise PerfReadError(f"the group holds {nr} counters, {events} were opened")
    return GroupRead(enabled_ns=enabled, running_ns=running, values=tuple(values))


def scaled(value: int, *, enabled_ns: int, running_ns: int) -> float:
    """A count scaled up to the time its group was enabled when the PMU multiplexed it (counted `running_ns` of
    `enabled_ns`): value × enabled / running, as `perf stat` does. The value as read when it counted all the time, and
    when the kernel reports no running time (a cgroup counter on a CPU where the cgroup never ran reads 0 / 0; the
    root cgroup's may read a count with 0 / 0)."""
    if running_ns <= 0 or enabled_ns <= running_ns:
        return float(value)
    return value * enabled_ns / running_ns


def totals(reads: Iterable[GroupRead], events: int) -> tuple[float, ...]:
    """Each counter's scaled count summed over the CPUs' groups."""
    sums = [0.0] * events
    for read in reads:
        for i, value in enumerate(read.values):
            sums[i] += scaled(value, enabled_ns=read.enabled_ns, running_ns=read.running_ns)
    return tuple(sums)


def cpi(cycles: float, instructions: float) -> float | None:
    """Cycles per instruction; None when no instruction was counted."""
    return cycles / instructions if instructions > 0 else None


class CpiCount(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A cgroup's cycles and instructions over one counting window that ended at `t` and lasted `seconds`."""

    t: float
    seconds: float
    cycles: float
    instructions: float

    @property
    def cpi(self) -> float | None:
        return cpi(self.cycles, self.instructions)


def count_of(reads: Sequence[GroupRead], *, t: float, seconds: float) -> CpiCount:
    """The CpiCount of the reads of a cycles + instructions group on every CPU."""
    cycles, instructions = totals(reads, 2)
    return CpiCount(t=t, seconds=seconds, cycles=cycles, instructions=instructions)


# --- rounds

_T = TypeVar("_T")


def plan_round(pods: Sequence[_T], *, fds_per_pod: int, max_fds: int, offset: int) -> tuple[list[_T], int]:
    """The pods one round counts and the next round's offset. All of them when their descriptors (`fds_per_pod`:
    one per event and CPU) fit `max_fds`; else as many as fit, starting at `offset` and wrapping around, so that
    every pod is counted in turn over the following rounds."""
    if not pods:
        return [], 0
    fit = max_fds // fds_per_pod if fds_per_pod > 0 else len(pods)
    if fit >= len(pods):
        return list(pods), 0
    start = offset % len(pods)
    return [pods[(start + i) % len(pods)] for i in range(fit)], (start + fit) % len(pods)


# --- why perf_event_open refused

_MEANING: Final = {
    errno.ENOENT: "the kernel knows no such event: it has no hardware PMU (a virtual machine without a virtual PMU, "
    "or a CPU its perf driver does not know)",
    errno.ENODEV: "the PMU does not support this event on this CPU",
    errno.EOPNOTSUPP: "the PMU cannot count this event here",
    errno.EACCES: "not permitted, kernel.perf_event_paranoid is {paranoid} and the agent has neither CAP_PERFMON nor "
    "CAP_SYS_ADMIN",
    errno.EPERM: "not permitted, by a seccomp profile (a container runtime's default one blocks perf_event_open) or a "
    "security module, or because kernel.perf_event_paranoid is {paranoid} and the agent has neither CAP_PERFMON "
    "nor CAP_SYS_ADMIN",
    errno.ENOSYS: "the kernel has no perf_event_open (built without CONFIG_PERF_EVENTS) or a filter hides it",
    errno.EINVAL: "the kernel refused the event's attributes",
    errno.E2BIG: "the kernel does not take this perf_event_attr size",
    errno.EMFILE: "the agent ran out of file descriptors",
    errno.ENFILE: "the system ran out of file descriptors",
    errno.EBUSY: "another user holds the PMU exclusively",
}
_CGROUP_MEANING: Final = {
    errno.ENOENT: "the directory is not a cgroup of a hierarchy with the perf_event controller",
    errno.EBADF: "the directory is not a cgroup of a hierarchy with the perf_event controller",
}


def explain_errno(code: int, *, paranoid: int | None = None, cgroup: bool = False) -> str:
    """`ENOENT: what that likely means` for an errno perf_event_open returned; `cgroup`: it was opened for a cgroup
    directory (where ENOENT and EBADF mean the directory is not a perf_event cgroup, the hardware events having
    been probed already); `paranoid`: kernel.perf_event_paranoid, when it could be read."""
    name = errno.errorcode.get(code, f"errno {code}")
    meaning = (_CGROUP_MEANING.get(code) if cgroup else None) or _MEANING.get(code)
    if meaning is None:
        return f"{name}: perf_event_open failed"
    return f"{name}: {meaning.format(paranoid='unknown' if paranoid is None else paranoid)}"
