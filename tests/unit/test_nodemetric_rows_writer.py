"""The nodemetric service's batched projection writer: one write at a time, and no rows lost to a cancelled write."""

from __future__ import annotations

import asyncio

from services.nodemetric.service import _BatchedWriter


class BlockingWrites:
    """A write function that records what it was given and, while `gate` is clear, waits inside the write."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started: list[list[int]] = []
        self.finished: list[list[int]] = []

    async def __call__(self, rows: list[int]) -> None:
        self.started.append(rows)
        await self.gate.wait()
        self.finished.append(rows)


async def test_a_write_waits_for_the_one_in_progress() -> None:
    """The interval's write and a full queue's write at once: the later rows must not commit first (the store
    would skip the earlier ones, at or below the offset the later write left)."""
    writes = BlockingWrites()
    writer: _BatchedWriter[int] = _BatchedWriter("rows", writes, limit=10)
    writer.add(1)
    writer.add(2)
    first = asyncio.create_task(writer.write())
    await asyncio.sleep(0)
    writer.add(3)
    second = asyncio.create_task(writer.write())
    for _ in range(5):
        await asyncio.sleep(0)
    assert writes.started == [[1, 2]]  # the second waits, its rows still queued

    writes.gate.set()
    await asyncio.gather(first, second)
    assert writes.finished == [[1, 2], [3]]


async def test_a_cancelled_write_keeps_its_rows_for_the_last_write() -> None:
    writes = BlockingWrites()
    writer: _BatchedWriter[int] = _BatchedWriter("rows", writes, limit=10)
    writer.add(1)
    task = asyncio.create_task(writer.write())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    writer.add(2)

    writes.gate.set()
    await writer.close()
    assert writes.finished == [[1, 2]]
    assert writer.failures == 0
