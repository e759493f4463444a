"""The nodemetric service applies a node's training round when the node's models are read next, not when the round
arrives (services.nodemetric.service.NodeMetricService.train): every agent ends its round on the same minute, so
applying them on arrival trained every node in one 10 s window (at 10,000 nodes, a backlog every minute). Spread by
the nodes' report phases, the reports still carry exactly the prediction of models trained on arrival."""

from __future__ import annotations

from agent.simulate import GiB, SimulatedNode
from bus import streams, subjects
from bus.api import Delivery
from bus.memory import MemoryBus
from schemas.node import NodeMetricComputed, NodeStateReported, encode_node_event
from schemas.prediction import decode_snapshot
from services.common.metrics import new_registry
from services.nodemetric.core import report_phase
from services.nodemetric.service import NodeMetricService, _IngestHandler
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.training import NodePredictor, state_capacity
from services.nodemetric.window import NodeWindow

T0 = 1_700_000_000 // 3600 * 3600  # on an hour: the agents' training minutes fall on multiples of 60 s


def nodes_with_phases(wanted: set[int]) -> dict[int, str]:
    """A node name for each report phase in `wanted` (seconds into the default 60 s interval, 10 s slots)."""
    found: dict[int, str] = {}
    for i in range(1000):
        name = f"spread-{i}"
        phase = report_phase(name, interval=60, step=10)
        if phase in wanted and phase not in found:
            found[phase] = name
        if len(found) == len(wanted):
            return found
    raise AssertionError(f"no names with phases {wanted - set(found)}")


class Feed:
    def __init__(self, service: NodeMetricService, names: list[str]) -> None:
        self.handler = _IngestHandler(service)
        self.sims = {
            name: SimulatedNode(name, i, cpu_cores=8, memory_bytes=32 * GiB, pods=8) for i, name in enumerate(names)
        }
        self.reference = {name: (NodeWindow(service.spec), NodePredictor()) for name in names}
        self.seq = 0
        self.predicted: list[NodeMetricComputed] = []
        """The reports made once the node had trained models, each checked against the reference."""

    async def deliver(self, name: str, data: bytes, subject: str) -> None:
        self.seq += 1
        await self.handler.handle(
            Delivery(subject=subject, data=data, headers={}, stream_seq=self.seq, num_delivered=1, published_at=0.0)
        )

    async def state(self) -> None:
        for name, sim in self.sims.items():
            state = NodeStateReported(node=name, at=T0, cpu_cores=sim.cpu_cores, memory_total=sim.memory_bytes)
            self.reference[name][1].capacity = state_capacity(state)
            await self.deliver(name, encode_node_event(state), subjects.node_state(name))

    async def window(self, start: float) -> None:
        """Every node's batch for [start, start + 10). The reference trains on arrival, as the service once did;
        each report the service makes must carry the reference's prediction at that moment."""
        for name, sim in self.sims.items():
            batch = sim.batch(start, start + 10)
            window, predictor = self.reference[name]
            if window.add(batch) and batch.training is not None:
                assert predictor.train(batch.training, window.added_pods())
            await self.deliver(name, encode_node_event(batch), subjects.node_metrics(name))
            for report in self.handler._pending.reports:
                if predictor.trained_until is not None:
                    want = predictor.predict(report.report_time, window.current_pods(), explain=False)
                    assert (report.status.prod_reclaimable, report.status.prod_peak) == (want.reclaimable, want.peak)
                    self.predicted.append(report)
            self.handler._pending.reports = []


def applied_rounds(service: NodeMetricService) -> float:
    return service._registry.get_sample_value("koordbus_nodemetric_training_rounds_total") or 0.0


async def test_a_minutes_rounds_are_applied_at_each_nodes_report_and_predict_as_if_applied_on_arrival() -> None:
    phases = nodes_with_phases({0, 30})
    early, late = phases[0], phases[30]
    service = NodeMetricService(MemoryBus(), None, NodeMetricSettings(), registry=new_registry())  # type: ignore[arg-type]
    feed = Feed(service, [early, late])
    await feed.state()
    for k in range(6 * 8 - 1):  # eight minutes but one window: the models trained, reports predicted
        await feed.window(T0 + 10 * k)
    before = applied_rounds(service)
    await feed.window(T0 + 470)  # ends on minute 480: both rounds arrive, only the phase-0 node reports
    assert applied_rounds(service) == before + 1
    await feed.window(T0 + 480)
    await feed.window(T0 + 490)
    assert applied_rounds(service) == before + 1
    await feed.window(T0 + 500)  # ends at 510: the phase-30 node reports, its round applied first
    assert applied_rounds(service) == before + 2

    assert {r.node for r in feed.predicted} == {early, late} and len(feed.predicted) >= 10
    for name in (early, late):
        assert service.predictor(name).snapshot(name, taken_at=0) == feed.reference[name][1].snapshot(name, taken_at=0)


async def test_a_periodic_snapshot_applies_the_waiting_round_and_the_stops_leaves_it_to_the_replay() -> None:
    phases = nodes_with_phases({0, 30})
    early, late = phases[0], phases[30]
    bus = MemoryBus()
    await bus.ensure_streams(streams.all_streams())
    settings = NodeMetricSettings()
    service = NodeMetricService(bus, None, settings, registry=new_registry(), clock=lambda: T0 + 185)  # type: ignore[arg-type]
    feed = Feed(service, [early, late])
    await feed.state()
    for k in range(6 * 3):  # three minutes: the round ending at minute 3 waits for the phase-30 node's report
        await feed.window(T0 + 10 * k)

    async def snapshotted_until(node: str) -> float:
        saved = await bus.last_on_subject(streams.KOORD_PREDICTION, subjects.stored(subjects.prediction_models(node)))
        assert saved is not None
        return decode_snapshot(saved.data).trained_until

    await service.save_snapshots(apply_waiting=False)  # as at a stop: the next owner replays the waiting round
    assert await snapshotted_until(early) == T0 + 180 and await snapshotted_until(late) == T0 + 120
    await service.save_snapshots()  # as the periodic loop: the waiting round applied first
    assert await snapshotted_until(late) == T0 + 180
    assert service.predictor(late).snapshot(late, taken_at=0) == feed.reference[late][1].snapshot(late, taken_at=0)
