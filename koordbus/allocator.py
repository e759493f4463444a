"""glibc's allocator in the long-running commands (up, service, agent): fewer arenas, freed memory given back.

A long-running koordbus process frees as much as it allocates once its windows are full, yet its resident set
crept up in the one-hour soak (issue 19): after the warm-up its live Python objects stayed flat while glibc kept
the memory it had been given back (free chunks inside its heaps, which it returns to the kernel only from a heap's
top). Two settings address that at its cause:

- `limit_arenas`: at most ARENA_MAX malloc arenas, set before any thread starts (glibc makes up to 8 per core, one
  per thread that allocates while another holds the lock; the database driver's and asyncio's worker threads each
  get one, each with its own free memory);
- `trim_periodically`: malloc_trim(0) every TRIM_INTERVAL_SECONDS, which hands the free pages inside every arena
  back to the kernel (madvise), not only the top of the heap.

Both are no-ops where the C library is not glibc (musl, macOS): `libc()` is None there.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import time
from typing import Final

log = logging.getLogger("koordbus.allocator")

ARENA_MAX: Final = 2
"""malloc arenas at most (glibc's M_ARENA_MAX; its default is 8 per core)."""
TRIM_INTERVAL_SECONDS: Final = 60.0
"""How often a long-running command hands glibc's free pages back to the kernel."""
_M_ARENA_MAX: Final = -8
"""mallopt's parameter number for M_ARENA_MAX (malloc.h)."""


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The process's glibc, or None where the C library has no mallopt/malloc_trim (not glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        library = ctypes.CDLL(name)
        library.mallopt.argtypes, library.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        library.malloc_trim.argtypes, library.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return library


def limit_arenas(arenas: int = ARENA_MAX) -> bool:
    """Cap glibc's malloc arenas (call before threads start; arenas already made stay); False where not glibc."""
    library = libc()
    return library is not None and library.mallopt(_M_ARENA_MAX, arenas) == 1


def trim() -> bool:
    """Give glibc's free pages back to the kernel now; True when some memory was released."""
    library = libc()
    return library is not None and library.malloc_trim(0) == 1


async def trim_periodically(interval: float = TRIM_INTERVAL_SECONDS) -> None:
    """`trim()` every `interval` seconds until cancelled. It runs in the event loop's thread (in another it would
    hold the arena's lock the loop allocates from just the same): on this machine 9 ms for a heap with little freed
    since the last trim, 98 ms for one with 0.9 GB of holes (8 KiB blocks, nine in ten freed), 16 ms after a million
    600-byte blocks freed."""
    if libc() is None:
        log.info("the C library is not glibc: freed memory is left to it")
        return
    while True:
        await asyncio.sleep(interval)
        began = time.perf_counter()
        released = trim()
        took_ms = 1e3 * (time.perf_counter() - began)
        log.debug("malloc_trim: %s in %.1f ms", "released memory" if released else "nothing to release", took_ms)
