"""New BE pod cgroups, seen as they appear (issue 23, point 7): inotify on the besteffort QoS directories.

The QoS loops read the kubelet's pod list every pods_poll_interval (5 s) and set a new pod's cgroups on the static
pass that follows; a BE pod would run with the kubelet's defaults until then. `CgroupWatch` watches the besteffort
directory of each hierarchy the BE loop writes (cpu and memory on cgroup v1, the unified one on v2) and each pod
directory created under it, so the runner wakes at once when a pod's or a container's cgroup appears, reads the pod
list again and runs the static pass (agent.loops.runner). Where inotify cannot be had (no such directory yet, a
kernel or filesystem without it, the instance limit reached) the watch says so once and the poll stays the only
way, as before. Bounded: at most MAX_WATCHES directories are watched; pod directories that go away drop out.

Linux's inotify(7) through libc (ctypes): inotify_init1 with IN_NONBLOCK | IN_CLOEXEC, inotify_add_watch with
IN_CREATE | IN_ONLYDIR; events are read from the non-blocking descriptor when the event loop says it is readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
from collections.abc import Iterable
from typing import Final

log = logging.getLogger(__name__)

IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE_SELF: Final = 0x00000400
IN_IGNORED: Final = 0x00008000
IN_ISDIR: Final = 0x40000000
IN_ONLYDIR: Final = 0x01000000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC
MAX_WATCHES: Final = 4096
"""Directories watched at most (besteffort dirs and their pods'): beyond it the poll covers the rest."""
_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of name


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None


class CgroupWatch:
    """Watches `roots` (absolute besteffort directories) and the directories created under them, one level down."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.created = asyncio.Event()
        """Set when a watched directory got a new subdirectory; the runner clears it."""
        self._fd = -1
        self._paths: dict[int, str] = {}
        self._roots = {os.path.normpath(r) for r in roots}
        self.available = False
        self.reason = ""
        libc = _libc()
        if libc is None or not hasattr(libc, "inotify_init1"):
            self.reason = "no inotify in this libc"
            return
        self._libc = libc
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self.reason = f"inotify_init1: {os.strerror(ctypes.get_errno())}"
            return
        self._fd = fd
        for root in sorted(self._roots):
            self._add(root)
        if not self._paths:
            self.close()
            self.reason = self.reason or "no besteffort directory to watch"
            return
        self.available = True

    def _add(self, path: str) -> None:
        if len(self._paths) >= MAX_WATCHES:
            return
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
        if wd < 0:
            self.reason = f"inotify_add_watch {path}: {os.strerror(ctypes.get_errno())}"
            return
        self._paths[wd] = path

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read events whenever the descriptor is readable (nothing when not available)."""
        if self.available:
            loop.add_reader(self._fd, self._drain)

    def _drain(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as e:
            log.warning("inotify read failed (the pod poll goes on alone): %s", e)
            self.close()
            return
        created = False
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _, size = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + size]
            offset += _EVENT.size + size
            name = os.fsdecode(raw.split(b"\0", 1)[0])
            parent = self._paths.get(wd)
            if mask & (IN_IGNORED | IN_DELETE_SELF):
                self._paths.pop(wd, None)
                continue
            if parent is None or not mask & (IN_CREATE | IN_MOVED_TO) or not mask & IN_ISDIR or not name or "/" in name:
                continue
            created = True
            if parent in self._roots:  # a pod directory: watch it for its containers' directories
                self._add(os.path.join(parent, name))
        if created:
            self.created.set()

    @property
    def watched(self) -> int:
        return len(self._paths)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(RuntimeError, ValueError):  # no running loop, or the reader never added
                asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self.available = False
        self._paths.clear()
