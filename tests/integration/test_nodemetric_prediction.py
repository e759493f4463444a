"""The prod predictor's models survive a restart and move with a node's partition (issue 22, point 2), on a real
nats-server: each replica snapshots its nodes' models to KOORD_PREDICTION, and whoever owns a node next restores the
snapshot and retrains the rounds after it from the history it replays. The models are compared, bit for bit, with a
reference trained over every round through the same pure path (NodeWindow + NodePredictor)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest_asyncio

from agent.simulate import GiB, SimulatedNode
from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas.node import MetricCollectPolicy, NodeMetricsReported, NodeStateReported, encode_node_event
from schemas.prediction import decode_snapshot
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth, db
from services.common.metrics import new_registry
from services.nodemetric import component as nodemetric_component
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from services.nodemetric.training import NodePredictor, state_capacity
from services.nodemetric.window import NodeWindow
from tests.support import api_auth
from tests.support.waiting import eventually

HISTORY_SECONDS = 60
"""The replicas' longest window, so a start-up replays only the last minute of what was published: whatever was
trained before that can only come back through a snapshot."""


class Cluster:
    """Simulated nodes whose batches are published minute by minute, and the reference models of every round."""

    def __init__(self, bus: JetStreamBus, nodes: list[str], start: float) -> None:
        self.bus = bus
        self.sims = {
            name: SimulatedNode(name, i, cpu_cores=8, memory_bytes=32 * GiB, pods=6) for i, name in enumerate(nodes)
        }
        self.next_start = start
        self.reference = {name: (NodeWindow(MetricCollectPolicy()), NodePredictor()) for name in nodes}

    async def publish_state(self) -> None:
        for name, sim in self.sims.items():
            state = NodeStateReported(
                node=name, at=self.next_start, cpu_cores=sim.cpu_cores, memory_total=sim.memory_bytes
            )
            self.reference[name][1].capacity = state_capacity(state)
            await self.bus.publish(subjects.node_state(name), encode_node_event(state), msg_id=f"state:{name}")

    async def publish_minutes(self, minutes: int) -> float:
        """Publish `minutes` more minutes of batches; the end of the last training round."""
        for _ in range(minutes * 6):
            start = self.next_start
            for name, sim in self.sims.items():
                batch = sim.batch(start, start + 10)
                self._train_reference(name, batch)
                await self.bus.publish(subjects.node_metrics(name), encode_node_event(batch), msg_id=f"{name}:{start}")
            self.next_start += 10
        return self.next_start

    def _train_reference(self, name: str, batch: NodeMetricsReported) -> None:
        window, predictor = self.reference[name]
        if window.add(batch) and batch.training is not None:
            assert predictor.train(batch.training, window.added_pods())

    def assert_same_models(self, service: NodeMetricService, nodes: set[str]) -> None:
        for name in nodes:
            expected = self.reference[name][1]
            got = service.predictor(name)
            assert got.trained_until == expected.trained_until, name
            assert got.snapshot(name, taken_at=0) == expected.snapshot(name, taken_at=0), name


def replica(
    bus: JetStreamBus, store: NodeMetricStore, clock: Callable[[], float], instance: str = ""
) -> NodeMetricService:
    settings = NodeMetricSettings(
        instance=instance,
        membership_ttl_seconds=4.0,
        report_phase_step_seconds=0,
        aggregate_duration_seconds=60,
        aggregate_durations_seconds=(HISTORY_SECONDS,),
        replay_slack_seconds=0,
        prediction_snapshot_interval_seconds=HISTORY_SECONDS,
    )
    return NodeMetricService(bus, store, settings, registry=new_registry(), clock=clock)


def replay_clock(replay_from: float) -> Callable[[], float]:
    """A clock standing at the moment that makes a replica replay the stream from `replay_from` (stream time) on,
    whenever the replica reads it. (A clock running from a shift taken when it was made let the replica start its
    replay a moment later, on a busy machine late enough to miss a training round's batch published right after
    `replay_from`: a CI failure. The replica reads its clock only for the replay's start and its metrics.)"""
    return lambda: replay_from + HISTORY_SECONDS


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[NodeMetricStore]:
    url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    try:
        yield NodeMetricStore(engine)
    finally:
        await engine.dispose()


async def test_a_restarted_replica_continues_the_models_from_the_snapshot_and_the_replay(
    store: NodeMetricStore, koordbus_bus: JetStreamBus
) -> None:
    nodes = ["sim-a", "sim-b"]
    cluster = Cluster(koordbus_bus, nodes, start=(time.time() // 60) * 60 - 1800)
    first = replica(koordbus_bus, store, time.time)
    await first.start()
    try:
        await cluster.publish_state()
        trained = await cluster.publish_minutes(10)
        await eventually(lambda: all(first.predictor(n).trained_until == trained for n in nodes), timeout=30)
        cluster.assert_same_models(first, set(nodes))
    finally:
        await first.stop()  # a clean stop snapshots what it trained
    saved = await koordbus_bus.last_on_subject(
        streams.KOORD_PREDICTION, subjects.stored(subjects.prediction_models("sim-a"))
    )
    assert saved is not None and decode_snapshot(saved.data).trained_until == trained

    stopped_at = time.time()
    trained = await cluster.publish_minutes(5)  # trained by nobody while no replica runs
    second = replica(koordbus_bus, store, replay_clock(stopped_at))
    await second.start()
    try:
        await eventually(lambda: all(second.predictor(n).trained_until == trained for n in nodes), timeout=30)
        cluster.assert_same_models(second, set(nodes))  # 10 minutes from the snapshot, 5 from the replay
        assert second.predictor("sim-a").models.models["__node__"].cpu.total > 10  # more rounds than the replay's 5
    finally:
        await second.stop()


async def test_a_node_moves_with_its_partition_and_keeps_its_models(
    store: NodeMetricStore, koordbus_bus: JetStreamBus
) -> None:
    nodes = [f"worker-{i}" for i in range(8)]
    cluster = Cluster(koordbus_bus, nodes, start=(time.time() // 60) * 60 - 1800)
    first = replica(koordbus_bus, store, time.time, instance="r1")
    await first.start()
    second: NodeMetricService | None = None
    try:
        await cluster.publish_state()
        trained = await cluster.publish_minutes(6)
        await eventually(lambda: all(first.predictor(n).trained_until == trained for n in nodes), timeout=30)
        await first.save_snapshots()  # the periodic snapshot, taken now rather than after a whole interval
        snapshotted = trained
        trained = await cluster.publish_minutes(2)
        await eventually(lambda: all(first.predictor(n).trained_until == trained for n in nodes), timeout=30)

        # The second replica shares the first's clock (membership needs one), so its replay holds every round: a
        # round applied twice, on top of the snapshot and again from the replay, would show in the models.
        second = replica(koordbus_bus, store, time.time, instance="r2")
        await second.start()

        def split() -> bool:
            a, b = first.owned or frozenset(), second.owned or frozenset() if second else frozenset()
            return bool(a) and bool(b) and not a & b and len(a | b) == subjects.NODE_PARTITIONS

        await eventually(split, timeout=20)
        moved = {n for n in nodes if subjects.node_partition(n) in (second.owned or ())}
        assert moved and moved != set(nodes), "the test needs nodes on both sides"
        trained = await cluster.publish_minutes(1)
        await eventually(lambda: all(second.predictor(n).trained_until == trained for n in moved), timeout=30)
        cluster.assert_same_models(second, moved)
        assert set(second._predictors) == moved  # it restored only the nodes of its partitions ...
        assert {n: second._snapshots.saved[n] for n in moved} == dict.fromkeys(moved, snapshotted)  # ... these
    finally:
        if second is not None:
            await second.stop()
        await first.stop()


async def test_the_api_shows_a_nodes_models_and_the_newest_prediction_explained(
    store: NodeMetricStore, koordbus_bus: JetStreamBus
) -> None:
    cluster = Cluster(koordbus_bus, ["sim-a"], start=(time.time() // 60) * 60 - 1800)
    service = replica(koordbus_bus, store, time.time)
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(nodemetric_component.reads(store, bus=koordbus_bus),),
    )
    app = create_app(context)
    await service.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as api:
            viewer = api_auth.headers(auth.VIEWER)
            await cluster.publish_state()
            # the node's state alone gives it a predictor, untrained: still "no training round" (CI once asked
            # after the state was applied and got an empty view)
            await eventually(lambda: service._predictors.get("sim-a") is not None, timeout=30)
            missing = await api.get("/api/v1/nodes/sim-a/prediction", headers=viewer)
            assert missing.status_code == 404 and "no training round" in missing.json()["error"]
            trained = await cluster.publish_minutes(4)

            def reported() -> bool:
                window = service._windows.get("sim-a")
                return service.predictor("sim-a").trained_until == trained and bool(window and window.last_report)

            await eventually(reported, timeout=30)
            response = await api.get("/api/v1/nodes/sim-a/prediction", headers=viewer)
            assert response.status_code == 200, response.text
            view = response.json()
            assert view["node"] == "sim-a" and view["trainedUntil"] == trained
            expected = cluster.reference["sim-a"][1]
            assert {m["uid"] for m in view["models"]} == set(expected.models.models)
            node_model = next(m for m in view["models"] if m["uid"] == "__node__")
            assert node_model["percentiles"] == expected.models.models["__node__"].prediction()
            # the newest report's prediction, as the reference models predict it for the same pods at the same time
            # (not "> 0": the simulated usage follows the time of day, and near the pods' daily peak the predicted
            # peak can reach their requests, leaving nothing reclaimable — it failed so at 06:15 UTC once)
            reference_window = cluster.reference["sim-a"][0]
            report_time = service._windows["sim-a"].last_report
            assert report_time is not None
            want = expected.predict(report_time, reference_window.current_pods(), explain=False)
            assert view["reclaimable"] == dict(want.reclaimable.resources) and set(view["reclaimable"]) == {
                "cpu",
                "memory",
            }
            assert want.peak is not None and view["peak"] == dict(want.peak.resources)
            pods = view["explanation"]["predictors"]["podReclaimablePredictor"]["pods"]
            assert pods and all(p["outcome"] in ("predicted", "cold start", "no model", "terminating") for p in pods)
            assert (await api.get("/api/v1/nodes/Not_A_Node/prediction", headers=viewer)).status_code == 422
            assert (await api.get("/api/v1/nodes/sim-a/prediction")).status_code == 401
    finally:
        await service.stop()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as api:
        gone = await api.get("/api/v1/nodes/sim-a/prediction", headers=api_auth.headers(auth.VIEWER))
        assert gone.status_code == 503 and "no nodemetric replica answers" in gone.json()["error"]


async def test_a_node_whose_agent_went_quiet_is_forgotten_not_snapshotted(
    store: NodeMetricStore, koordbus_bus: JetStreamBus
) -> None:
    service = replica(koordbus_bus, store, time.time)
    quiet, live = NodePredictor(trained_until=time.time() - 3600), NodePredictor(trained_until=time.time() - 60)
    service._predictors.update({"quiet-node": quiet, "live-node": live})
    await service.save_snapshots()
    assert set(service._predictors) == {"live-node"}  # every model of the quiet one had expired (30 minutes)
    stored = subjects.stored(subjects.prediction_models("quiet-node"))
    assert await koordbus_bus.last_on_subject(streams.KOORD_PREDICTION, stored) is None
