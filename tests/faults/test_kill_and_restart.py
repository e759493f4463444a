"""kill -9 each projecting service at a random moment under load, restart it, and compare with a clean replay.

For every service that consumes events and keeps a projection (nodemetric, noderesource, quota, migration, slo):
a real nats-server (file store, sync_interval "always"), the inputs the service needs on the bus, then
`koordbus service <name>` started on a SQLite file while a load of input events is published; at a random moment
(seeded: KOORDBUS_FAULTS_SEED reproduces a run, and every assertion message names the seed) the process gets
SIGKILL and is started again on the same database, the load goes on, and once its consumers have caught up it is
stopped. Then a clean replay — a fresh process of the same service over the same streams into an empty database —
runs until it has caught up. The test asserts:

* the killed-and-restarted database reads back exactly as the clean replay's (the store's own read methods);
* no decision was lost: the clean replay has nothing to add to the decision stream (a decision the killed run
  never published would be published now, under a message id the stream has not seen);
* no decision was duplicated: every decision's identity (its Nats-Msg-Id, and for last-value decisions the value)
  is in the stream once.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bus import streams
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from services.common import db
from tests.faults import service_cases as cases
from tests.faults.processes import KoordbusProcess, consumers_caught_up, consumers_exist, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

SEED_ENV = "KOORDBUS_FAULTS_SEED"
CATCH_UP_TIMEOUT_SECONDS = 30.0
SETTLED_FOR_SECONDS = 1.0
"""Decision streams unchanged this long (after the consumers caught up): the service has nothing left to say."""


@pytest.fixture
def seed() -> int:
    return int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1 << 31))


@pytest_asyncio.fixture
async def nats(tmp_path: Path) -> AsyncIterator[tuple[str, JetStreamBus]]:
    server = EmbeddedNatsServer(tmp_path / "nats", sync_interval="always")
    await server.start()
    bus = await JetStreamBus.connect(server.url, name="faults")
    try:
        await bus.ensure_streams(streams.all_streams())
        yield server.url, bus
    finally:
        await bus.close()
        await server.stop()


@dataclass
class Run:
    """One service case's processes and what the assertions need to say."""

    case: cases.Case
    nats_url: str
    bus: JetStreamBus
    tmp_path: Path
    seed: int
    started: list[KoordbusProcess] = field(default_factory=list)

    def context(self) -> str:
        return f"service {self.case.service}, seed {self.seed} ({SEED_ENV}={self.seed} reproduces it)"

    def process(self, database: str) -> KoordbusProcess:
        arguments = ["service", self.case.service, "--nats-url", self.nats_url, "--port", "0"]
        if self.case.database:
            arguments += ["--database-url", self.database_url(database)]
        process = KoordbusProcess(
            arguments, log_path=self.tmp_path / f"{database}.log", env={"KOORDBUS_LOG_LEVEL": "INFO", **self.case.env}
        )
        self.started.append(process)
        return process

    def database_url(self, database: str) -> str:
        return f"sqlite:///{self.tmp_path / database}.db"

    async def consumed(self, process: KoordbusProcess) -> None:
        """Until the process's consumers have everything acked (the process may have been killed and started again
        meanwhile: its consumers are the ones made since its latest start)."""

        async def idle() -> bool:
            process.assert_alive()
            return await consumers_caught_up(self.nats_url, self.case.durables, since=process.started_at)

        await wait_for(idle, timeout=CATCH_UP_TIMEOUT_SECONDS, what=f"{self.context()}: consumers caught up")

    async def caught_up(self, process: KoordbusProcess) -> None:
        """Until the process's consumers have everything acked and its decision streams stop changing."""
        await self.consumed(process)
        last = await self.decision_heads()
        steady_since = time.monotonic()
        while time.monotonic() - steady_since < SETTLED_FOR_SECONDS:
            await asyncio.sleep(0.2)
            process.assert_alive()
            now = await self.decision_heads()
            if now != last:
                last, steady_since = now, time.monotonic()
        await self.consumed(process)

    async def decision_heads(self) -> tuple[int, ...]:
        return tuple([(await self.bus.stream_info(stream))[1] for stream in self.case.decision_streams])

    async def projection(self, database: str) -> Any:
        if not self.case.database:
            return await self.case.read_projection(self.bus, None)
        engine = db.create_engine(self.database_url(database))
        try:
            return await self.case.read_projection(self.bus, engine)
        finally:
            await engine.dispose()


async def _drive_load(
    run: Run, process: KoordbusProcess, load: Callable[[int], Awaitable[None]], *, steps: int, interval: float
) -> None:
    """Each step once the process has consumed the previous one and `interval` has passed: each step is decided on
    its own, so how many decisions the load makes does not depend on this machine's speed (unpaced, a loaded machine
    piled the steps into a few coalesced batches: 8 decisions where the case needs 10), and the kill, drawn within
    the load's span, lands on work in flight as often as on a pause."""
    for step in range(steps):
        await load(step)
        await asyncio.gather(run.consumed(process), asyncio.sleep(interval))


@pytest.mark.parametrize("service", cases.SERVICES)
async def test_a_killed_service_restarts_into_the_clean_replay(
    service: str, nats: tuple[str, JetStreamBus], tmp_path: Path, seed: int
) -> None:
    nats_url, bus = nats
    rng = random.Random(seed)
    case = cases.build(service, rng)
    run = Run(case=case, nats_url=nats_url, bus=bus, tmp_path=tmp_path, seed=seed)
    load: asyncio.Task[None] | None = None
    try:
        await case.setup(bus)
        killed = run.process("killed")
        killed.start()
        load = asyncio.create_task(
            _drive_load(run, killed, lambda step: case.load(bus, step), steps=case.steps, interval=case.step_seconds)
        )
        await wait_for(
            lambda: consumers_exist(nats_url, case.durables, since=killed.started_at),
            timeout=CATCH_UP_TIMEOUT_SECONDS,
            what=f"{run.context()}: consumers started",
        )
        await case.after_start(bus)
        kill_after = rng.uniform(0.0, case.kill_window)
        await asyncio.sleep(kill_after)
        killed.assert_alive()
        killed.kill()
        killed.start()
        await load
        await run.caught_up(killed)
        killed.stop()
        heads = await run.decision_heads()
        before = await case.read_decisions(bus)

        replay = run.process("replay")
        replay.start()
        await run.caught_up(replay)
        replay.stop()

        what = f"{run.context()}, killed {kill_after:.2f} s after its consumers started"
        after = await case.read_decisions(bus)
        assert await run.decision_heads() == heads, (
            f"{what}: the clean replay published decisions the killed run had not: "
            f"{[d for d in after if d not in before]}"
        )
        case.assert_no_duplicates(before, what)
        assert not (repeated := await case.repeats(bus)), f"{what}: decisions republished unchanged: {repeated}"
        assert case.enough(before), f"{what}: the load produced too few decisions to test anything: {len(before)}"
        restarted, clean = await run.projection("killed"), await run.projection("replay")
        assert restarted == clean, f"{what}: the restarted service's projection differs from a clean replay"
    finally:
        if load is not None and not load.done():
            load.cancel()
        for process in run.started:
            process.kill()
