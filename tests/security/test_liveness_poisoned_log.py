"""A quota log holding events no service can handle does not stop `koordbus up` from starting (issue #19, point 2).

The test builds the poisoned data dir of the report itself: a nats-server on the data dir's store, and two
QuotaCreated events appended straight onto the quota log (past the API, as an older koordbus let them in): one
quota named with 100,000 characters, one whose tree label has 5,000 characters. Publishing either one's status
used to make nats-server drop the connection, and every later start replayed the event and exited 1. Now
`koordbus up` (a real process) on that dir starts, answers /readyz, shows both skipped events (dead-lettered with
their reasons on koord.v1.dlq.quota, counted in /metrics, named on the tree) and still creates other quotas.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import httpx
import pytest

from bus import auth, streams, subjects
from bus.api import HEADER_DLQ_REASON
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from koordbus.up_bus import NATS_CREDS_FILE
from schemas import quota_events as ev
from schemas.kube import ObjectMeta
from schemas.quota import LABEL_TREE_ID, ElasticQuota
from tests.faults.processes import KoordbusProcess, stream_messages, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LONG_NAME = "q" * 100_000
LONG_TREE = "t" * 5_000


def poisoned_event(number: int, obj: ElasticQuota) -> bytes:
    when = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    return ev.encode_quota_event(ev.QuotaCreated(actor="old-api", time=when, command_id=f"poison-{number}", quota=obj))


async def build_poisoned_data_dir(data_dir: Path) -> None:
    """The report's data dir: the quota log (in the nats store `koordbus up` uses) holds the two poisoned events."""
    server = EmbeddedNatsServer(store_dir=data_dir / "nats", log_file=data_dir / "nats-server.log")
    await server.start()
    try:
        bus = await JetStreamBus.connect(server.url, name="poisoner")
        try:
            await bus.ensure_streams(streams.all_streams())
            long_name = ElasticQuota(metadata=ObjectMeta(name=LONG_NAME, namespace="teams"))
            long_tree = ElasticQuota(
                metadata=ObjectMeta(name="tall", namespace="teams", labels={LABEL_TREE_ID: LONG_TREE})
            )
            for number, obj in enumerate((long_name, long_tree), start=1):
                await bus.publish(
                    subjects.quota_events("default"), poisoned_event(number, obj), msg_id=f"poison-{number}"
                )
        finally:
            await bus.close()
    finally:
        await server.stop()


async def test_up_starts_on_a_poisoned_quota_log_and_shows_the_skipped_events(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    await build_poisoned_data_dir(data_dir)
    port = free_port()
    up = KoordbusProcess(
        ["up", "--data-dir", str(data_dir), "--port", str(port), "--no-agent"], log_path=tmp_path / "up.log"
    )
    up.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:

            async def ready() -> bool:
                up.assert_alive()  # the old code exited 1 here: "publishing quota status failed"
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(ready, timeout=60, what="koordbus up ready on the poisoned data dir")
            token = (data_dir / "api-token").read_text().strip()
            http.headers["Authorization"] = f"Bearer {token}"

            # both events were skipped, each counted and dead-lettered with its reason
            metrics = (await http.get("/metrics")).text
            assert 'koordbus_consumer_dead_lettered_total{consumer="quota-events",service="quota"} 2.0' in metrics
            assert "koordbus_quota_unusable_events_total 2.0" in metrics
            nats_url = json.loads(next((data_dir / "nats" / "ports").glob("*.ports")).read_text())["nats"][0]
            user, password = auth.read_creds((data_dir / NATS_CREDS_FILE).read_text(), source="up's credentials")
            reader = await JetStreamBus.connect(nats_url, name="dlq-reader", user=user, password=password)
            try:
                letters = await stream_messages(reader, streams.KOORD_DLQ, subjects.dlq("quota"))
            finally:
                await reader.close()
            reasons = [d.headers[HEADER_DLQ_REASON] for d in letters]
            assert len(reasons) == 2, reasons
            assert "quota qqqq" in reasons[0] and "(100000 characters) cannot have a status" in reasons[0]
            assert "tree tttt" in reasons[1] and "(5000 characters) cannot have a status" in reasons[1]
            # the tree the events were appended to shows the problem, in a bounded message
            trees = {t["tree"]: t for t in (await http.get("/api/v1/quota-trees")).json()["items"]}
            (problem,) = trees["default"]["problems"]
            assert problem.startswith("event 2 skipped: tree tttt") and len(problem) < 600

            # the quota service works: another quota is created, and the bus connection is still there
            created = await http.post(
                "/api/v1/quotas",
                json={"metadata": {"name": "team-a", "namespace": "teams"}, "spec": {"max": {"cpu": "4"}}},
            )
            assert created.status_code == 201, created.text

            async def listed() -> bool:  # the read side is a projection: it follows the log
                return (await http.get("/api/v1/quotas/team-a")).status_code == 200

            await wait_for(listed, timeout=10, what="team-a readable")
            assert (await http.get("/readyz")).status_code == 200
            up.assert_alive()
    finally:
        await asyncio.to_thread(up.stop)
