"""PostgreSQL stops for OUTAGE_SECONDS under running `koordbus service nodemetric` and `noderesource` processes.

A private PostgreSQL cluster (tests/faults/private_postgres.py; never the shared server on 5432) and a private
nats-server (`koordbus_nats_url`). A feeder publishes, every FEED_INTERVAL_SECONDS, one NodeMetric and one agent
state report per node; noderesource decides each node from them and publishes its decisions. While the database is down:
  * both processes stay up and /readyz answers 503 naming the database (the bus stays ready);
  * what does not need the database keeps flowing: noderesource keeps deciding and publishing.
Once it is back, /readyz answers 200 and the projections catch up: every table the two projectors write equals a
clean replay of the same streams into a fresh database (tests/faults/replay.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from bus import streams, subjects
from bus.api import Bus
from bus.jetstream import JetStreamBus
from schemas.node import NodeStateReported, encode_node_event
from services.common.tasks import cancel_and_wait
from tests.faults import private_postgres
from tests.faults.private_postgres import PrivatePostgres
from tests.faults.replay import projection_tables, replay_into
from tests.faults.service_process import ServiceProcess
from tests.support.events import publish_events
from tests.support.waiting import eventually
from tests.unit.test_noderesource_state import config_event, metric_event, node_event

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

OUTAGE_SECONDS = 30.0
"""How long PostgreSQL is down: the issue's number."""
FEED_INTERVAL_SECONDS = 1.0
NODES = ("pg-outage-a", "pg-outage-b", "pg-outage-c")
READY_TIMEOUT_SECONDS = 60.0
"""Start-up (imports, migrations, the start-up replay) and reconnecting after the outage."""
CATCH_UP_TIMEOUT_SECONDS = 45.0
PROBE_INTERVAL_SECONDS = 1.0


@pytest_asyncio.fixture
async def postgres() -> AsyncIterator[PrivatePostgres]:
    if (reason := private_postgres.missing_reason()) is not None:
        pytest.skip(f"cannot run a private PostgreSQL cluster for the outage test: {reason}")
    cluster = PrivatePostgres()
    try:
        await asyncio.to_thread(cluster.create)
        await asyncio.to_thread(cluster.start)
        yield cluster
    finally:
        await asyncio.to_thread(cluster.destroy)


class Feeder:
    """Publishes each node's NodeMetric and agent state report every FEED_INTERVAL_SECONDS until stopped."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.ticks = 0

    async def tick(self) -> None:
        now = time.time()
        system_cores = 2 + self.ticks % 4  # moves batch-cpu, so every tick is a new decision per node
        for node in NODES:
            await publish_events(self._bus, metric_event(node, at=now, system_cores=system_cores))
            state = NodeStateReported(node=node, at=now, agent_version="faults", cpu_cores=100.0 + self.ticks)
            await self._bus.publish(subjects.node_state(node), encode_node_event(state), msg_id=f"{node}:{now}")
        self.ticks += 1

    async def run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(FEED_INTERVAL_SECONDS)


async def all_ready(services: list[ServiceProcess], client: httpx.AsyncClient) -> bool:
    for service in services:
        assert service.running, service.describe()
        status, _ = await service.readyz(client)
        if status != 200:
            return False
    return True


async def test_services_survive_a_postgres_outage_and_catch_up(
    postgres: PrivatePostgres, koordbus_nats_url: str, tmp_path: Path
) -> None:
    nats_url = koordbus_nats_url
    database_url = await postgres.create_database("koordbus_outage")
    bus = await JetStreamBus.connect(nats_url, name="pg-outage-feeder")
    await publish_events(bus, config_event(), *(node_event(node) for node in NODES))
    common = ("--nats-url", nats_url, "--database-url", database_url)
    services = [ServiceProcess(name, *common, log_dir=tmp_path) for name in ("nodemetric", "noderesource")]
    feeder = Feeder(bus)
    feeding: asyncio.Task[None] | None = None
    async with httpx.AsyncClient() as client:
        try:
            for service in services:
                service.start()
            await eventually(lambda: all_ready(services, client), timeout=READY_TIMEOUT_SECONDS)
            feeding = asyncio.create_task(feeder.run(), name="pg-outage-feeder")
            await eventually(lambda: feeder.ticks >= 3)
            tables_before = await projection_tables(database_url)
            assert tables_before["node_metrics"] and tables_before["node_resource_decisions"]

            await asyncio.to_thread(postgres.stop)
            decisions_at_stop, _ = await bus.stream_info(streams.KOORD_NODERESOURCE)
            ticks_at_stop = feeder.ticks
            deadline = time.monotonic() + OUTAGE_SECONDS
            probes = 0
            while time.monotonic() < deadline:
                for service in services:
                    assert service.running, f"died during the outage: {service.describe()}"
                    status, body = await service.readyz(client)
                    assert status == 503, f"/readyz {status} {body} during the outage: {service.describe()}"
                    failures = body["failures"]
                    assert isinstance(failures, dict) and set(failures) == {"database"}, body
                probes += 1
                await asyncio.sleep(PROBE_INTERVAL_SECONDS)
            assert probes >= OUTAGE_SECONDS / PROBE_INTERVAL_SECONDS / 2
            decisions_in_outage, _ = await bus.stream_info(streams.KOORD_NODERESOURCE)
            # noderesource needs no database to decide: one new decision per node per tick kept coming
            assert decisions_in_outage - decisions_at_stop >= len(NODES) * (feeder.ticks - ticks_at_stop - 2)

            await asyncio.to_thread(postgres.start)
            await eventually(lambda: all_ready(services, client), timeout=READY_TIMEOUT_SECONDS)
            await cancel_and_wait(feeding)
            feeding = None
            await assert_projections_catch_up(postgres, nats_url, database_url, services)
            for service in services:
                assert await service.stop() == 0, f"unclean exit: {service.describe()}"
        finally:
            if feeding is not None:
                await cancel_and_wait(feeding)
            for service in services:
                await service.stop()
            await bus.close()


async def assert_projections_catch_up(
    postgres: PrivatePostgres, nats_url: str, database_url: str, services: list[ServiceProcess]
) -> None:
    """Every projected table of the outage database equals a clean replay of the streams into a fresh database.

    The streams may still grow for a moment (a decision published just before the feeder stopped): the replay is
    redone whenever they have, until both sides agree or CATCH_UP_TIMEOUT_SECONDS pass."""
    replay_url = await postgres.create_database("koordbus_clean_replay")
    bus = await JetStreamBus.connect(nats_url, name="pg-outage-replay")
    replayed: dict[str, list[dict[str, object]]] = {}
    replayed_counts: tuple[int, ...] = ()
    actual: dict[str, list[dict[str, object]]] = {}
    try:
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            for service in services:
                assert service.running, f"died while catching up: {service.describe()}"
            counts = tuple([(await bus.stream_info(name))[0] for name in REPLAYED_STREAMS])
            if counts != replayed_counts:
                replayed = await replay_into(bus, replay_url)
                replayed_counts = counts
            actual = await projection_tables(database_url)
            if actual == replayed:
                return
            await asyncio.sleep(0.5)
        pytest.fail(f"projections did not catch up in {CATCH_UP_TIMEOUT_SECONDS:g} s: {differences(replayed, actual)}")
    finally:
        await bus.close()


def differences(expected: dict[str, list[dict[str, object]]], actual: dict[str, list[dict[str, object]]]) -> str:
    """Per differing table: how many rows each side has and a few rows only one side has."""
    lines = []
    for name, rows in expected.items():
        got = actual.get(name, [])
        if rows != got:
            missing = [row for row in rows if row not in got]
            extra = [row for row in got if row not in rows]
            lines.append(
                f"{name}: replay has {len(rows)} rows, the service's database {len(got)}; "
                f"missing {len(missing)}, e.g. {_brief(missing)}; unexpected {len(extra)}, e.g. {_brief(extra)}"
            )
    return "; ".join(lines)


def _brief(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in row.items() if k in ("node", "stream_seq", "consumer", "last_seq")} for row in rows[:5]]


REPLAYED_STREAMS = (streams.KOORD_NODE, streams.KOORD_NODEMETRIC, streams.KOORD_NODERESOURCE)
