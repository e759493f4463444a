"""koordbus.allocator: glibc takes the arena cap, malloc_trim gives the free pages inside the heap back to the kernel
(what the long-running commands do every minute), and the periodic trim runs until cancelled."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap

import pytest

from koordbus import allocator

pytestmark = pytest.mark.skipif(allocator.libc() is None, reason="the C library here is not glibc")

HOLES = textwrap.dedent(
    """
    import os
    from koordbus import allocator

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    # 40,000 blocks of 8 KiB from glibc's heap (bytes objects this size bypass Python's small-object allocator);
    # every tenth stays, so the freed ones are holes glibc cannot return from the heap's top.
    blocks = [bytes(8192) for _ in range(40_000)]
    kept = blocks[::10]
    del blocks
    before = rss_mb()
    released = allocator.trim()
    print(before, rss_mb(), released, len(kept))
    """
)


def test_trim_gives_the_holes_in_the_heap_back() -> None:
    run = subprocess.run([sys.executable, "-c", HOLES], capture_output=True, text=True, timeout=60, check=True)
    before, after, released, _ = run.stdout.split()
    assert released == "True"
    # ~280 MiB of holes (9 in 10 of ~312 MiB): without the trim the process would keep them resident.
    assert float(before) - float(after) > 200, run.stdout


def test_the_arena_cap_is_taken() -> None:
    assert allocator.limit_arenas(2) is True


async def test_trims_every_interval_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    thrice = asyncio.Event()

    def counted_trim() -> bool:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 3:
            thrice.set()
        return False

    monkeypatch.setattr(allocator, "trim", counted_trim)
    task = asyncio.create_task(allocator.trim_periodically(0.01))
    await thrice.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    seen = len(calls)
    await asyncio.sleep(0.05)
    assert len(calls) == seen and all(b - a >= 0.009 for a, b in itertools.pairwise(calls))
