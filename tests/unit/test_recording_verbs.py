"""Record-only cluster verbs (services.k8s.recording_verbs): a pod read back from the cluster stream, writes
recorded and handed to whatever stands in for the cluster."""

from __future__ import annotations

import msgspec

from bus import streams, subjects
from bus.api import msg_id
from bus.memory import MemoryBus
from schemas import k8s_verbs as wire
from schemas.cluster import PodObserved
from schemas.scheduling import SchedulingPod
from services.k8s.recording_verbs import RecordingVerbs

POD = msgspec.convert(
    {"metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1"}, "spec": {"nodeName": "n1"}}, SchedulingPod
)


async def _observe(bus: MemoryBus, *, deleted: bool, version: str) -> None:
    observed = PodObserved(
        namespace="shop", name="web-1", observed_at=1.0, uid="u-1", node_name="n1", deleted=deleted, pod=POD,
        resource_version=version,
    )  # fmt: skip
    await bus.publish(subjects.cluster_pod("shop", "web-1"), msgspec.json.encode(observed), msg_id=msg_id("t", version))


async def test_a_pod_reads_as_the_cluster_stream_last_has_it_and_an_eviction_is_recorded_and_handed_on() -> None:
    bus = MemoryBus()
    await bus.ensure_streams([streams.cluster_stream()])
    evicted: list[tuple[str, str]] = []

    async def on_evict(namespace: str, name: str) -> None:
        evicted.append((namespace, name))

    verbs = RecordingVerbs(bus, on_evict=on_evict, clock=lambda: 5.0)
    missing = await verbs.carry_out(wire.GetPod(namespace="shop", name="web-1"))
    assert missing.status == 404
    await _observe(bus, deleted=False, version="1")
    found = await verbs.carry_out(wire.GetPod(namespace="shop", name="web-1"))
    assert found.status == 200 and msgspec.json.decode(found.object)["metadata"]["uid"] == "u-1"
    answer = await verbs.carry_out(wire.EvictPod(namespace="shop", name="web-1"))
    assert answer.status == 201 and evicted == [("shop", "web-1")]
    assert verbs.export() == [{"at": 5.0, "verb": "k8s.pod.evict", "target": "shop/web-1"}]
    await _observe(bus, deleted=True, version="2")
    gone = await verbs.carry_out(wire.GetPod(namespace="shop", name="web-1"))
    assert gone.status == 404


async def test_a_reservation_reads_back_as_created_until_deleted() -> None:
    bus = MemoryBus()
    verbs = RecordingVerbs(bus)
    reservation = {"metadata": {"name": "r-1"}, "spec": {}}
    assert (await verbs.carry_out(wire.CreateReservation(reservation=reservation))).status == 201
    read = await verbs.carry_out(wire.GetReservation(name="r-1"))
    assert read.status == 200 and msgspec.json.decode(read.object) == reservation
    assert (await verbs.carry_out(wire.DeleteReservation(name="r-1"))).status == 200
    assert (await verbs.carry_out(wire.GetReservation(name="r-1"))).status == 404
    assert (await verbs.carry_out(wire.WriteMigrationJobStatus(name="j", status={}))).status == 200
