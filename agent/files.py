"""Reading and writing cgroup and resctrl files under one configured root, and nowhere else.

Every path is relative and is checked before use: no absolute paths, no `..`, no empty components, and the
directory it is in must lie inside the root once symlinks are resolved; the file itself is opened with O_NOFOLLOW
and never created (cgroup files exist or the cgroup is gone). A rejected path raises PathRejected; an I/O failure
raises OSError with the path — the loops turn both into a Problem for that object and go on.

Checking a directory costs one lstat when its parent was already checked in the same round (a real directory under
a checked one is inside); only a symlink is resolved in full. `new_round()` forgets the verdicts, so a directory
swapped for a symlink between rounds is caught at the next round's first use.

Reads keep up to `max_open` files open and re-read them with pread at offset 0 (a cgroup file regenerates its
content on every read from the start): the loops read the same few thousand files every pass, and open + close was
two thirds of a read. The path is still checked on every read before the kept descriptor is used; a descriptor
whose cgroup was removed fails (ENODEV) and the path is opened again once. `sweep()` closes the descriptors not read
since the previous sweep (the loops sweep at each static pass, so the files of pods that left are closed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat


class PathRejected(ValueError):
    """A path that would leave the configured root, or is not a plain relative path."""


class RootedFiles:
    def __init__(self, root: str, *, max_open: int = 0) -> None:
        if not os.path.isabs(root):
            raise PathRejected(f"root {root!r} must be an absolute path")
        self.root = root.rstrip("/") or "/"
        self.max_open = max_open
        self._real_root = os.path.realpath(self.root)
        self._inside: set[str] = set()
        """Relative directories checked this round."""
        self._fds: dict[str, int] = {}
        self._read_since_sweep: set[str] = set()

    def new_round(self) -> None:
        self._inside.clear()

    def path(self, rel: str) -> str:
        """The absolute path of `rel`, after the checks of the module docstring."""
        parts = rel.split("/")
        if "" in parts or "." in parts or ".." in parts:  # also catches "" and a leading or trailing "/"
            raise PathRejected(f"{rel!r} is not a plain relative path")
        directory = rel.rpartition("/")[0]
        if directory and not self._checked(directory):
            raise PathRejected(f"{rel!r} resolves outside {self.root}")
        return f"{self.root}/{rel}"

    def _checked(self, directory: str) -> bool:
        if directory in self._inside:
            return True
        parent = directory.rpartition("/")[0]
        if parent and not self._checked(parent):
            return False
        full = f"{self.root}/{directory}"
        try:
            is_link = stat.S_ISLNK(os.lstat(full).st_mode)
        except FileNotFoundError:
            return True  # nothing there to escape through; opening under it fails with ENOENT
        except NotADirectoryError:
            return True
        if is_link:
            real = os.path.realpath(full)
            if real != self._real_root and not real.startswith(self._real_root.rstrip("/") + "/"):
                return False
        self._inside.add(directory)
        return True

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def read(self, rel: str) -> str | None:
        """The file's content; None when it (or its directory) does not exist."""
        path = self.path(rel)
        fd = self._fds.get(rel)
        if fd is not None:
            self._read_since_sweep.add(rel)
            try:
                return pread_all(fd).decode()
            except OSError:  # its cgroup was removed (and perhaps created again): open the path afresh
                self._close(rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            text = pread_all(fd).decode()
        except BaseException:
            os.close(fd)
            raise
        if len(self._fds) < self.max_open:
            self._fds[rel] = fd
            self._read_since_sweep.add(rel)
        else:
            os.close(fd)
        return text

    def sweep(self) -> None:
        """Close the kept descriptors not read since the previous sweep."""
        for rel in [r for r in self._fds if r not in self._read_since_sweep]:
            self._close(rel)
        self._read_since_sweep.clear()

    def close(self) -> None:
        for rel in list(self._fds):
            self._close(rel)

    def _close(self, rel: str) -> None:
        fd = self._fds.pop(rel, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def write(self, rel: str, value: str) -> None:
        """Replace the file's value (one write(2), as the kernel wants it); OSError when the kernel refuses."""
        self._write(rel, value, os.O_WRONLY | os.O_TRUNC)

    def append(self, rel: str, value: str) -> None:
        """Append one value (resctrl `tasks` takes one thread id per write)."""
        self._write(rel, value, os.O_WRONLY | os.O_APPEND)

    def _write(self, rel: str, value: str, flags: int) -> None:
        path = self.path(rel)
        fd = os.open(path, flags | os.O_NOFOLLOW)
        try:
            data = value.encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.EIO, "short write", path)
        finally:
            os.close(fd)

    def mkdir(self, rel: str) -> None:
        os.makedirs(self.path(rel), mode=0o755, exist_ok=True)


def pread_all(fd: int) -> bytes:
    """The whole content of an open file, read from offset 0 whatever the file position."""
    chunk = os.pread(fd, 65536, 0)
    if len(chunk) < 65536:
        return chunk
    chunks = [chunk]
    while len(chunks[-1]) == 65536:
        chunks.append(os.pread(fd, 65536, 65536 * len(chunks)))
    return b"".join(chunks)
