"""SIGKILL (or SIGSTOP for a bounded time: a partition) the nats-server a service depends on, on a three-server
JetStream cluster with R3 streams, under load.

For every service that consumes events and keeps a projection (the cases of tests/faults/service_cases.py: the
same inputs, load, decisions and projections as test_kill_and_restart.py), on tests/fixtures/nats_cluster.py's
cluster (the chart's configuration, streams created at R3 by the real `ensure_streams`, the services told
KOORDBUS_STREAM_REPLICAS=3): `koordbus service <name>` runs while its load is published, and at a seeded random
moment the server leading the stream it depends on most gets SIGKILL — KOORD_NODE for nodemetric (its input), the
decision stream for noderesource, KOORD_QUOTA for quota and KOORD_MIGRATION for migration (their
expected-last-subject-sequence appends), its consumer's leader for slo. The service is not restarted. The test
asserts that the service rides it out: it never exits, its consumers catch up with the whole load (through the
cluster's election; the bus retries what it answers meanwhile), and then, as in test_kill_and_restart.py, a clean
replay into an empty database publishes nothing the failover run had not (no decision lost), no decision is in its
stream twice, and the projections read back the same. The killed server is started again and catches up before
the replay, so the replay runs on the whole cluster; a paused one is resumed after PAUSE_SECONDS (a new leader
elected meanwhile) and rejoins as a follower.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bus import streams
from bus.jetstream import JetStreamBus
from tests.faults import service_cases as cases
from tests.faults.processes import KoordbusProcess, stream_messages, wait_for
from tests.faults.test_kill_and_restart import CATCH_UP_TIMEOUT_SECONDS, SEED_ENV, Run
from tests.fixtures.nats_cluster import REPLICAS, ClusterUnderTest

pytestmark = [pytest.mark.faults, pytest.mark.timeout(90)]

ELECTION_TIMEOUT_SECONDS = 30.0
DONE = {"kill": "killed", "pause": "paused"}
PAUSE_SECONDS = 10.0
"""How long a paused (SIGSTOP) server stays partitioned: past the election of a new leader, then it is resumed."""
CLUSTER_CATCH_UP_SECONDS = 50.0
"""Longer than test_kill_and_restart's bound by the consumers' ack_wait (30 s): messages a killed server had sent
on a connection it took down are redelivered by the consumer's new leader only after ack_wait."""


@pytest.fixture
def seed() -> int:
    """KOORDBUS_FAULTS_SEED reproduces a run (every assertion message names the seed)."""
    return int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1 << 31))


def target(case: cases.Case) -> tuple[str, str | None]:
    """(stream, durable or None): what the server to kill leads for `case`'s service."""
    match case.service:
        case "nodemetric":
            return streams.KOORD_NODE, None
        case "noderesource":
            return streams.KOORD_NODERESOURCE, None
        case "quota":
            return streams.KOORD_QUOTA, None
        case "migration":
            return streams.KOORD_MIGRATION, None
    stream, durable = case.durables[0]
    return stream, durable


class ClusterRun(Run):
    """test_kill_and_restart.Run on the cluster: processes connect with the fixture's credentials, consumers are
    asked about through the test's bus."""

    creds: Path

    def process(self, database: str, *, instance: str = "", port: int = 0) -> KoordbusProcess:
        """A process on `database`; with `instance`, a replica of a scaled-out service (its own log)."""
        arguments = ["service", self.case.service, "--nats-url", self.nats_url, "--port", str(port)]
        arguments += ["--nats-creds", str(self.creds)]
        if self.case.database:
            arguments += ["--database-url", self.database_url(database)]
        env = {"KOORDBUS_LOG_LEVEL": "INFO", "KOORDBUS_STREAM_REPLICAS": str(REPLICAS), **self.case.env}
        if instance:
            env[f"KOORDBUS_{self.case.service.upper()}_INSTANCE"] = instance
        log = f"{database}-{instance}" if instance else database
        process = KoordbusProcess(arguments, log_path=self.tmp_path / f"{log}.log", env=env)
        self.started.append(process)
        return process

    async def consumed(self, process: KoordbusProcess) -> None:
        async def idle() -> bool:
            process.assert_alive()
            return await consumers_state(self.bus, self.case.durables, since=process.started_at, idle=True)

        await wait_for(idle, timeout=CLUSTER_CATCH_UP_SECONDS, what=f"{self.context()}: consumers caught up")

    async def assert_clean_replay(self, what: str) -> None:
        """Once the failover run's processes have stopped (on database "failover"): a clean replay into an empty
        database ("replay") publishes nothing the failover run had not (no decision lost), no decision is in its
        stream twice or republished unchanged, and the two projections read back the same."""
        case, bus = self.case, self.bus
        heads = await self.decision_heads()
        before = await case.read_decisions(bus)
        stored = [m for stream in case.decision_streams for m in await stream_messages(bus, stream, ">")]
        last = {m.subject: m.data for m in stored}  # what the failover run left on each subject

        replay = self.process("replay")
        replay.start()
        await self.caught_up(replay)
        await asyncio.to_thread(replay.stop)

        after = await case.read_decisions(bus)
        if await self.decision_heads() != heads:
            published = [
                m
                for stream, head in zip(case.decision_streams, heads, strict=True)
                for m in await stream_messages(bus, stream, ">")
                if m.stream_seq > head
            ]
            changed = [
                f"{m.subject}:\n  failover run: {last.get(m.subject, b'')[:2000]!r}\n  replay: {m.data[:2000]!r}"
                for m in published
            ]
            raise AssertionError(
                f"{what}: the clean replay published decisions the failover run had not: "
                f"{[d for d in after if d not in before]}; per subject, the last one before and after the replay:\n"
                + "\n".join(changed[:10])
            )
        case.assert_no_duplicates(before, what)
        assert not (repeated := await case.repeats(bus)), f"{what}: decisions republished unchanged: {repeated}"
        assert case.enough(before), f"{what}: the load produced too few decisions to test anything: {len(before)}"
        through, clean = await self.projection("failover"), await self.projection("replay")
        assert through == clean, f"{what}: the projection differs from a clean replay"


async def consumers_state(
    bus: JetStreamBus, durables: tuple[tuple[str, str], ...], *, since: float, idle: bool
) -> bool:
    """Every (stream, durable) exists, made since `since`, and (`idle`) has nothing left to deliver or ack; False
    while the cluster cannot say (an election under way)."""
    for stream, durable in durables:
        try:
            info = await bus.jetstream.consumer_info(stream, durable, timeout=2)
        except Exception:  # not there yet, or no leader to answer: not caught up
            return False
        created = info.created.timestamp() if info.created is not None else 0.0
        if created < since or (idle and (info.num_pending or info.num_ack_pending)):
            return False
    return True


async def _drive_load(run: Run, process: KoordbusProcess, load: Callable[[int], Awaitable[None]]) -> None:
    """As test_kill_and_restart._drive_load: each step once the previous one is consumed."""
    for step in range(run.case.steps):
        await load(step)
        await asyncio.gather(run.consumed(process), asyncio.sleep(run.case.step_seconds))


@pytest.mark.parametrize("service", cases.SERVICES)
@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_a_service_rides_out_the_loss_of_the_server_leading_its_stream(
    fault: str, service: str, nats_cluster: ClusterUnderTest, tmp_path: Path, seed: int
) -> None:
    cluster = nats_cluster.cluster
    rng = random.Random(seed)
    case = cases.build(service, rng)
    bus = await nats_cluster.connect("faults")
    run = ClusterRun(case=case, nats_url=cluster.url, bus=bus, tmp_path=tmp_path, seed=seed)
    run.creds = nats_cluster.creds_file(tmp_path, user=service)
    load: asyncio.Task[None] | None = None
    try:
        await case.setup(bus)
        survivor = run.process("failover")
        survivor.start()
        load = asyncio.create_task(_drive_load(run, survivor, lambda step: case.load(bus, step)))
        await wait_for(
            lambda: consumers_state(bus, case.durables, since=survivor.started_at, idle=False),
            timeout=CATCH_UP_TIMEOUT_SECONDS,
            what=f"{run.context()}: consumers started",
        )
        await case.after_start(bus)
        kill_after = rng.uniform(0.0, case.kill_window)
        await asyncio.sleep(kill_after)
        stream, durable = target(case)

        async def leader() -> str | None:
            if durable is None:
                return await cluster.stream_leader(stream)
            return await cluster.consumer_leader(stream, durable)

        victim = await cluster.wait_for(leader, timeout=ELECTION_TIMEOUT_SECONDS, what=f"a leader of {stream}")
        survivor.assert_alive()
        killed_at = time.monotonic()
        if fault == "kill":
            await cluster.kill(cluster.index_of(victim))
        else:
            cluster.pause(cluster.index_of(victim))
        elected = await cluster.wait_for(leader, timeout=ELECTION_TIMEOUT_SECONDS, what=f"a new leader of {stream}")
        election = time.monotonic() - killed_at
        what = (
            f"{run.context()}, {victim} (leading {durable or stream}) {DONE[fault]} {kill_after:.2f} s after the "
            f"consumers started, {elected} elected in {election:.1f} s"
        )
        assert elected != victim, what
        if fault == "pause":  # the partition heals: the old leader comes back as a follower
            await asyncio.sleep(max(0.0, PAUSE_SECONDS - (time.monotonic() - killed_at)))
            cluster.resume(cluster.index_of(victim))
        await load
        await run.caught_up(survivor)
        recovered = time.monotonic() - killed_at
        survivor.assert_alive()
        print(f"\n{what}; caught up with the load {recovered:.1f} s after the {fault}")  # the figures, with -s

        if fault == "kill":
            await cluster.restart(cluster.index_of(victim))
        for spec in case.decision_streams:
            await wait_for(lambda s=spec: cluster.stream_current(s), timeout=ELECTION_TIMEOUT_SECONDS, what=what)
        survivor.stop()
        await run.assert_clean_replay(what)
    finally:
        if load is not None and not load.done():
            load.cancel()
        for process in run.started:
            process.kill()
        await bus.close()
