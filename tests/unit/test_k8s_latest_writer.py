"""services.k8s.latest_writer.LatestWriter while its writes fail: intents keep coming, attempts stay backed off.

The quota and NodeSLO mirrors offer a new intent whenever a status or spec changes (every second for a busy quota).
Before, each new intent reset the key's backoff and was written at once: one failing write per intent for as long
as the API server failed. Now a newer intent takes the older one's place and its retry time.
"""

from __future__ import annotations

import asyncio

from services.k8s.latest_writer import LatestWriter
from services.k8s.sinks import WriteFailedError

INITIAL, MAXIMUM = 0.05, 0.4
FAILING_SECONDS = 1.2
OFFER_EVERY_SECONDS = 0.01


class FlakyApi:
    def __init__(self) -> None:
        self.failing = True
        self.attempts: list[tuple[str, int]] = []
        self.written: list[tuple[str, int]] = []

    async def write(self, key: str, intent: int) -> str:
        self.attempts.append((key, intent))
        if self.failing:
            raise WriteFailedError("HTTP 500: injected")
        self.written.append((key, intent))
        return "updated"


async def test_new_intents_inherit_the_backoff_and_only_the_last_lands_once_after_recovery() -> None:
    api = FlakyApi()
    writer: LatestWriter[int] = LatestWriter(
        "test", api.write, interval=0.0, backoff_initial=INITIAL, backoff_max=MAXIMUM, unhealthy_after=3
    )
    writer.start()
    try:
        intent = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAILING_SECONDS
        while loop.time() < deadline:
            intent += 1
            for key in ("a", "b"):
                writer.offer(key, intent)
            await asyncio.sleep(OFFER_EVERY_SECONDS)
        assert not writer.health.healthy
        # ~100 intents per key; backed off (0.05, 0.1, 0.2, 0.4, 0.4 …) that is about 6 attempts per key
        per_key = {key: sum(1 for k, _ in api.attempts if k == key) for key in ("a", "b")}
        assert all(3 <= n <= 10 for n in per_key.values()), per_key
        api.failing = False
        assert await writer.wait_drained(loop.time() + 2 * MAXIMUM + 1.0)
        await asyncio.sleep(2 * MAXIMUM)  # nothing else is written later
        assert sorted(api.written) == [("a", intent), ("b", intent)]
        assert writer.health.healthy
    finally:
        await writer.stop()


async def test_a_change_is_written_after_the_delay_with_the_latest_intent_and_later_ones_do_not_push_it() -> None:
    """The quota mirror's delay (K8sSettings.quota_write_delay_seconds): a change made with kubectl reaches the log a
    moment before kube-apiserver stores it, so the mirror waits before writing; a busy quota is still written."""
    loop = asyncio.get_running_loop()
    written: list[tuple[str, int, float]] = []

    async def write(key: str, intent: int) -> str:
        written.append((key, intent, loop.time()))
        return "updated"

    delay = 0.3
    writer: LatestWriter[int] = LatestWriter(
        "test", write, interval=0.0, delay=delay, backoff_initial=INITIAL, backoff_max=MAXIMUM, unhealthy_after=3
    )
    writer.start()
    try:
        offered = loop.time()
        for intent in (1, 2, 3):  # a new intent every 0.08 s: they coalesce, none pushes the write later
            writer.offer("a", intent)
            await asyncio.sleep(0.08)
        assert await writer.wait_drained(loop.time() + 2)
        ((key, intent, at),) = written
        assert (key, intent) == ("a", 3) and delay <= at - offered < delay + 0.15
        writer.offer("a", 4)  # after a write: the next change waits the delay again
        again = loop.time()
        assert await writer.wait_drained(loop.time() + 2)
        assert [i for _, i, _ in written] == [3, 4] and written[1][2] - again >= delay
    finally:
        await writer.stop()


async def test_drained_means_no_write_under_way_either() -> None:
    """wait_drained (the mirrors' wait_idle, for tests): a write taken from the pending map but not answered yet
    still counts (a test reading the cluster right after must see it)."""
    loop = asyncio.get_running_loop()
    started, release = asyncio.Event(), asyncio.Event()

    async def write(key: str, intent: int) -> str:
        started.set()
        await release.wait()
        return "updated"

    writer: LatestWriter[int] = LatestWriter(
        "test", write, interval=0.0, backoff_initial=INITIAL, backoff_max=MAXIMUM, unhealthy_after=3
    )
    writer.start()
    try:
        writer.offer("a", 1)
        await asyncio.wait_for(started.wait(), 2)
        assert writer.pending == 0 and not await writer.wait_drained(loop.time() + 0.1)
        release.set()
        assert await writer.wait_drained(loop.time() + 2)
    finally:
        await writer.stop()
