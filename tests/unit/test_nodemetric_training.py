"""The prod predictor's training path (issue 22): the agent measures each minute's round (agent.batch), the batch
carries it (schemas.node.TrainingRound), the nodemetric service trains the node's models from it and puts the
prediction in the NodeMetric status (services.nodemetric.training, window, core)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import struct

import msgspec
import pytest

from agent.batch import BatchBuilder, TrainingAccumulator, attribute_pods
from agent.core import PodSample, Tick
from agent.pods import parse_pod_list
from agent.simulate import SimulatedNode
from bus import streams
from bus.memory import MemoryBus
from schemas import koordinator, kube, prediction, vocab
from schemas.node import (
    NODE_EVENT_DECODER,
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeStateReported,
    PodRef,
    TrainingRound,
    encode_node_event,
)
from schemas.nodemetric_json import snapshot_from_computed
from schemas.percentile import nearest_rank, nearest_rank_index
from services.nodemetric import predictor, snapshots, training
from services.nodemetric.core import PodInfo
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.window import NodeWindow, compute_status
from tests.support import crd

GiB = 1 << 30
PROD_UID = "11111111-2222-3333-4444-555555555555"
BATCH_UID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
T0 = 1_800_000_000.0  # a whole minute


def pod_item(uid: str, name: str, *, cpu: str, memory: str, labels: dict[str, str], **meta: str) -> dict[str, object]:
    return {
        "metadata": {"uid": uid, "namespace": "shop", "name": name, "labels": labels, **meta},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
        "status": {"phase": "Running", "qosClass": "Burstable"},
    }


def listed(*items: dict[str, object]) -> list:  # type: ignore[type-arg]
    return list(parse_pod_list(json.dumps({"kind": "PodList", "items": list(items)}).encode()).pods)


PROD = pod_item(
    PROD_UID,
    "web-0",
    cpu="4",
    memory="8Gi",
    labels={vocab.PRIORITY_CLASS_LABEL: vocab.PRIORITY_PROD},
    creationTimestamp="2026-01-01T00:00:00Z",
)
BATCH = pod_item(BATCH_UID, "spark-0", cpu="0", memory="0", labels={vocab.PRIORITY_CLASS_LABEL: vocab.PRIORITY_BATCH})


def tick(at: float, prod_cpu: float, batch_cpu: float = 0.5) -> Tick:
    pods = (
        PodSample(
            pod=PodRef(uid=PROD_UID, kube_qos="Burstable"), sample=(at, prod_cpu, 2 * GiB), memory_with_page_cache=0
        ),
        PodSample(
            pod=PodRef(uid=BATCH_UID, kube_qos="Burstable"), sample=(at, batch_cpu, GiB), memory_with_page_cache=0
        ),
    )
    node_cpu = prod_cpu + batch_cpu + 1.0
    return Tick(
        at=at,
        node=(at, node_cpu, 4 * GiB),
        node_memory_with_page_cache=5 * GiB,
        system=(at, 1.0, GiB),
        pods=attribute_pods(pods, listed(PROD, BATCH)),
    )


def minute_of_batches(start: float, cpu_of_second: dict[int, float] | None = None) -> list:  # type: ignore[type-arg]
    """Six 10-second batches of one minute, built in order by one agent builder."""
    builder = BatchBuilder("node-a", interval=10.0)
    batches = []
    for second in range(60):
        cpu = (cpu_of_second or {}).get(second, 1.0)
        if (batch := builder.add(tick(start + second, cpu))) is not None:
            batches.append(batch)
    batches.append(builder.close(sent_at=start + 60))
    return batches


def test_the_nearest_rank_index_is_koordinators_float32_one() -> None:
    assert [nearest_rank_index(n, 0.9) for n in (0, 1, 10, 60, 100)] == [0, 0, 8, 53, 89]
    assert nearest_rank([5.0, 1.0, 3.0], 0.9) == 3.0  # int(3 × 0.9) − 1 = 1: the second smallest
    with pytest.raises(ValueError):
        nearest_rank([], 0.9)


def test_the_kubelets_list_gives_the_predictor_its_facts() -> None:
    deleting = pod_item("d" * 32, "old", cpu="500m", memory="1Gi", labels={}, deletionTimestamp="2026-01-02T00:00:00Z")
    measured = [
        PodSample(pod=PodRef(uid=uid, kube_qos="Burstable"), sample=(1.0, 0.1, 1), memory_with_page_cache=0)
        for uid in (PROD_UID, "d" * 32)
    ]
    prod, gone = (s.pod for s in attribute_pods(measured, listed(PROD, deleting)))
    assert (prod.cpu_request, prod.memory_request, prod.terminating) == (4000, 8 * GiB, False)
    assert prod.created_at == dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
    assert (gone.cpu_request, gone.memory_request, gone.created_at, gone.terminating) == (500, GiB, None, True)


def test_the_batch_that_ends_a_minute_carries_the_minutes_p90s() -> None:
    batches = minute_of_batches(T0, cpu_of_second={s: 1.0 + s / 100 for s in range(60)})
    assert [b.training is not None for b in batches] == [False] * 5 + [True]
    training = batches[-1].training
    assert training is not None and (training.start, training.end) == (T0, T0 + 60)
    prod_index = [p.uid for p in batches[-1].pods].index(PROD_UID)
    cpus = [1.0 + s / 100 for s in range(60)]
    assert training.pods == sorted(training.pods) and len(training.pods) == 2
    assert training.pod_cpu[training.pods.index(prod_index)] == sorted(cpus)[nearest_rank_index(60, 0.9)]
    assert training.node_cpu == sorted(c + 1.5 for c in cpus)[53]
    assert training.node_memory == 4 * GiB
    assert NODE_EVENT_DECODER.decode(encode_node_event(batches[-1])) == batches[-1]


def test_a_round_holds_only_its_own_minute() -> None:
    accumulator = TrainingAccumulator()
    accumulator.add(tick(T0 - 5, 9.0))  # the previous minute: dropped when this minute's first tick comes
    for second in range(50, 60):
        accumulator.add(tick(T0 + second, 2.0))
    pods = [PodRef(uid=PROD_UID)]
    assert accumulator.close(T0 + 50, pods) is None  # not a round's end: it keeps collecting
    round_ = accumulator.close(T0 + 60, pods)
    assert round_ is not None and round_.pod_cpu == [2.0] and round_.pods == [0]
    assert accumulator.close(T0 + 60, pods) is None  # closed once


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"start": T0, "end": T0}, "must be after `start`"),
        ({"start": T0, "end": T0 + 7200}, "by at most 3600 s"),
        ({"start": T0, "end": T0 + 60, "node_cpu": 1.0}, "come together"),
        ({"start": T0, "end": T0 + 60, "pods": [0], "pod_cpu": [], "pod_memory": []}, "must be parallel"),
        ({"start": T0, "end": T0 + 60, "pods": [0, 0], "pod_cpu": [1, 1], "pod_memory": [1, 1]}, "appears twice"),
        ({"start": T0, "end": T0 + 60, "pods": [5], "pod_cpu": [1.0], "pod_memory": [1]}, "out of range"),
        ({"start": T0, "end": T0 + 60, "pods": [0], "pod_cpu": [-1.0], "pod_memory": [1]}, "Expected `float` >= 0"),
    ],
)
def test_a_bad_training_round_fails_decoding_naming_it(training: dict[str, object], message: str) -> None:
    batch = minute_of_batches(T0)[-1]
    raw = msgspec.msgpack.decode(encode_node_event(batch))
    raw["training"] = training
    with pytest.raises(msgspec.ValidationError, match=message):
        NODE_EVENT_DECODER.decode(msgspec.msgpack.encode(raw))


def info(uid: str, priority: str, *, cpu: int, memory: int, created_at: float | None = None) -> PodInfo:
    return PodInfo("shop", uid, uid, priority, "LS", cpu, memory, created_at, False)


def test_a_round_is_applied_once_and_only_with_its_pod_list() -> None:
    node = training.NodePredictor()
    pods = [info("p", vocab.PRIORITY_PROD, cpu=4000, memory=8 * GiB)]
    round_ = TrainingRound(
        start=T0, end=T0 + 60, node_cpu=2.0, node_memory=GiB, pods=[0], pod_cpu=[1.0], pod_memory=[GiB // 2]
    )
    assert node.train(round_, None) is False and node.skipped_rounds == 1  # the batch's list was never received
    assert node.train(round_, pods) is True and node.trained_until == T0 + 60
    assert node.train(round_, pods) is False and node.skipped_rounds == 1  # a replayed round: already applied
    assert set(node.models.models) == {
        "p",
        predictor.NODE_UID,
        predictor.SYSTEM_UID,
        *(predictor.node_item_uid(c) for c in predictor.KNOWN_PRIORITY_CLASSES),
    }


def test_the_prediction_is_the_min_predictors_over_the_trained_models() -> None:
    """Trained through the service's path, the answer equals the calc path's (the predictor module fed directly)."""
    node = training.NodePredictor(capacity={"cpu": 32_000, "memory": 128 * GiB})
    pods = [
        info("web", vocab.PRIORITY_PROD, cpu=4000, memory=8 * GiB),
        info("new", vocab.PRIORITY_PROD, cpu=2000, memory=GiB, created_at=T0 + 3000),  # cold start
        info("job", vocab.PRIORITY_BATCH, cpu=0, memory=0),
    ]
    direct = predictor.Models()
    for minute in range(30):
        end = T0 + 60 * (minute + 1)
        cpu = [1.0 + minute % 3 * 0.1, 0.5, 2.0]
        round_ = TrainingRound(
            start=end - 60,
            end=end,
            node_cpu=5.0,
            node_memory=20 * GiB,
            pods=[0, 1, 2],
            pod_cpu=cpu,
            pod_memory=[2 * GiB, GiB // 2, 4 * GiB],
        )
        node.train(round_, pods)
        usages = [
            predictor.PodUsage(p.uid, p.priority, c, float(m))
            for p, c, m in zip(pods, cpu, round_.pod_memory, strict=True)
        ]
        direct.train(training.seconds_ns(end), usages, 5.0, float(20 * GiB))
    report = T0 + 1800
    prediction = node.predict(report, pods)
    kube_node = {"metadata": {}, "status": {"allocatable": {"cpu": "32", "memory": "128Gi"}}}
    prod = predictor.prod_predictor(
        "min",
        lookup=direct.prediction,
        node=msgspec.convert(kube_node, kube.Node),
        now_ns=training.seconds_ns(report),
    )
    expected = predictor.predict(prod, [training.pod_facts(p) for p in pods])  # every pod, the batch one too
    assert prediction.reclaimable.resources == expected.reclaimable
    assert prediction.peak is not None and prediction.peak.resources == expected.peak
    assert prediction.explanation["predictors"] == prod.explain()
    # web requests 4 cores and uses about 1.2: its p95 × 1.1 is unreclaimable, the rest reclaimable
    web_p95 = direct.prediction("web")["p95"]["cpu"]  # type: ignore[index]
    assert 0 < prediction.reclaimable.resources["cpu"] <= 4000 - int(web_p95 * 1.1)
    assert prediction.explanation["predictors"]["podReclaimablePredictor"]["unpredicted"]["cpu"] == 2000


def test_without_models_or_capacity_the_prediction_fails_as_koordinators_does() -> None:
    node = training.NodePredictor()
    pods = [info("web", vocab.PRIORITY_PROD, cpu=4000, memory=8 * GiB)]
    prediction = node.predict(T0, pods)
    assert prediction.reclaimable.resources == {} and prediction.peak is None
    assert "node is nil" in prediction.explanation["errors"]["reclaimable"]


def test_the_service_path_puts_the_prediction_into_the_status_in_koordinators_shape() -> None:
    """Simulated batches → window and predictor → status → Koordinator JSON and the noderesource snapshot."""
    sim = SimulatedNode("sim-node", 3)
    spec = MetricCollectPolicy()
    window = NodeWindow(spec)
    node = training.NodePredictor()
    node.capacity = training.state_capacity(
        NodeStateReported(node="sim-node", at=T0, cpu_cores=sim.cpu_cores, memory_total=sim.memory_bytes)
    )
    for start in range(int(T0), int(T0) + 600, 10):
        batch = sim.batch(start, start + 10)
        assert window.add(batch)
        if batch.training is not None:
            assert node.train(batch.training, window.added_pods())
    assert node.trained_until == T0 + 600
    report_time = T0 + 600
    prediction = node.predict(report_time, window.current_pods())
    status = msgspec.structs.replace(
        compute_status(window, report_time=report_time, spec=spec),
        prod_reclaimable=prediction.reclaimable,
        prod_peak=prediction.peak,
    )
    assert prediction.reclaimable.resources.get("cpu", 0) > 0, prediction.explanation
    rendered = koordinator.nodemetric_status_to_json(status, quantities=True)
    crd.assert_valid_nodemetric(koordinator.nodemetric_object("sim-node", spec, status))
    assert set(rendered["prodReclaimableMetric"]) == {"resource"}
    assert set(rendered["prodPeakMetric"]["resource"]["resources"]) == {"cpu", "memory"}
    event = NodeMetricComputed(node="sim-node", report_time=report_time, spec=spec, status=status)
    decoded = msgspec.json.decode(msgspec.json.encode(event), type=NodeMetricComputed)
    assert snapshot_from_computed(decoded).prod_reclaimable == prediction.reclaimable.resources


def trained(rounds: int, start: float = T0) -> training.NodePredictor:
    node = training.NodePredictor(capacity={"cpu": 8000, "memory": 32 * GiB})
    pods = [
        info("web", vocab.PRIORITY_PROD, cpu=4000, memory=8 * GiB),
        info("job", vocab.PRIORITY_BATCH, cpu=0, memory=0),
    ]
    for minute in range(rounds):
        end = start + 60 * (minute + 1)
        cpu = [1.0 + (minute * 7 % 5) / 10, 0.3 + minute % 2]
        round_ = TrainingRound(
            start=end - 60,
            end=end,
            node_cpu=3.0,
            node_memory=9 * GiB,
            pods=[0, 1],
            pod_cpu=cpu,
            pod_memory=[GiB, 2 * GiB],
        )
        node.train(round_, pods)
    return node


def test_a_snapshot_restores_the_models_bit_for_bit_and_training_goes_on_alike() -> None:
    original = trained(40)
    data = prediction.encode_snapshot(original.snapshot("node-a", taken_at=T0 + 2400))
    restored = training.NodePredictor.restore(prediction.decode_snapshot(data))
    assert restored.snapshot("node-a", 0) == original.snapshot("node-a", 0)
    assert restored.capacity == original.capacity and restored.trained_until == original.trained_until
    later = trained(60)  # the same 40 rounds and 20 more
    pods = [
        info("web", vocab.PRIORITY_PROD, cpu=4000, memory=8 * GiB),
        info("job", vocab.PRIORITY_BATCH, cpu=0, memory=0),
    ]
    for minute in range(40, 60):
        end = T0 + 60 * (minute + 1)
        cpu = [1.0 + (minute * 7 % 5) / 10, 0.3 + minute % 2]
        restored.train(
            TrainingRound(
                start=end - 60,
                end=end,
                node_cpu=3.0,
                node_memory=9 * GiB,
                pods=[0, 1],
                pod_cpu=cpu,
                pod_memory=[GiB, 2 * GiB],
            ),
            pods,
        )
    assert restored.snapshot("node-a", 0) == later.snapshot("node-a", 0)
    assert restored.predict(T0 + 3600, pods).reclaimable == later.predict(T0 + 3600, pods).reclaimable
    assert len(data) < 4000  # 8 models of two histograms, a few buckets each


async def test_each_snapshot_tick_saves_one_part_of_the_nodes_and_every_node_within_the_interval() -> None:
    # The service saves part tick % PARTS every interval / PARTS: all nodes at once was ~10 s of CPU at 10,000
    # nodes, the ingest stalled behind it.
    bus = MemoryBus()
    await bus.ensure_streams([streams.prediction_stream()])
    nodes = {f"node-{i:03d}": trained(2) for i in range(60)}
    part = {node: snapshots.part_of(node) for node in nodes}
    assert set(part.values()) == set(range(snapshots.PARTS))
    writer = snapshots.SnapshotWriter(bus)
    turns = 0

    async def ingest() -> None:  # what else runs on the loop
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    taken: list[tuple[str, int]] = []  # each snapshot taken: its node, and how often the other task had run

    def recording(node: training.NodePredictor) -> training.NodePredictor:
        snapshot = node.snapshot

        def taking(name: str, taken_at: float) -> prediction.ModelsSnapshot:
            taken.append((name, turns))
            return snapshot(name, taken_at)

        node.snapshot = taking  # type: ignore[method-assign]
        return node

    nodes = {name: recording(node) for name, node in nodes.items()}
    other = asyncio.create_task(ingest())
    saved: set[str] = set()
    try:
        for tick in range(snapshots.PARTS):
            taken.clear()
            mine = {node for node, p in part.items() if p == tick}
            assert await writer.save(nodes, now=T0 + 600, part=tick) == len(mine)
            assert sorted(name for name, _ in taken) == sorted(mine)  # only its part is encoded
            turns_seen = [t for _, t in taken]
            assert turns_seen == sorted(set(turns_seen))  # the loop ran between any two nodes' snapshots
            saved |= mine
            assert set(writer.saved) == saved
            assert set((await snapshots.restore(bus, None)).predictors) == saved  # what a next owner reads
    finally:
        other.cancel()
    assert saved == set(nodes)  # every node within one interval (PARTS ticks)
    restored = (await snapshots.restore(bus, None)).predictors
    assert all(restored[n].snapshot(n, 0) == nodes[n].snapshot(n, 0) for n in nodes)
    assert await writer.save(nodes, now=T0 + 1200, part=0) == 0  # nothing trained since its snapshot


def corrupt(snapshot: prediction.ModelsSnapshot, **histogram: object) -> prediction.ModelsSnapshot:
    model = snapshot.models[0]
    return msgspec.structs.replace(
        snapshot, models=[msgspec.structs.replace(model, cpu=msgspec.structs.replace(model.cpu, **histogram))]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"buckets": b"\xff\xff", "weights": struct.pack("<d", 1.0)}, "bucket 65535 outside"),
        ({"max_bucket": 60_000}, "bounds"),
        ({"weights": b""}, "do not pair up"),
        ({"buckets": b"\x02\x00\x01\x00", "weights": struct.pack("<2d", 1.0, 1.0)}, "increasing order"),
        ({"buckets": b"\x01\x00", "weights": struct.pack("<d", float("nan"))}, "not finite"),
        ({"total": float("inf")}, "total weight"),
    ],
)
def test_a_corrupt_snapshot_is_refused_saying_why(change: dict[str, object], message: str) -> None:
    bad = corrupt(trained(3).snapshot("node-a", taken_at=T0), **change)
    decoded = prediction.decode_snapshot(prediction.encode_snapshot(bad))
    with pytest.raises(ValueError, match=message):
        training.NodePredictor.restore(decoded)


def test_a_snapshot_of_another_version_or_shape_does_not_decode() -> None:
    good = msgspec.msgpack.decode(prediction.encode_snapshot(trained(2).snapshot("node-a", taken_at=T0)))
    for bad in ({**good, "type": "prediction.snapshot.v2"}, {**good, "node": "Not_A_Node"}, {**good, "models": "x"}):
        with pytest.raises(msgspec.ValidationError):
            prediction.decode_snapshot(msgspec.msgpack.encode(bad))
    with pytest.raises(msgspec.DecodeError):
        prediction.decode_snapshot(b"\xc1garbage")


def test_the_snapshot_interval_never_exceeds_the_history_a_restart_replays() -> None:
    assert NodeMetricSettings().snapshot_interval_seconds == 600  # koordlet's checkpoint interval
    short = NodeMetricSettings(aggregate_duration_seconds=60, aggregate_durations_seconds=(120,))
    assert short.snapshot_interval_seconds == 120
    with pytest.raises(ValueError, match=r"snapshot_interval_seconds must be positive and at most .* \(1800 s"):
        NodeMetricSettings(prediction_snapshot_interval_seconds=3600)
    with pytest.raises(ValueError, match="prediction_snapshot_interval_seconds"):
        NodeMetricSettings(prediction_snapshot_interval_seconds=0)
