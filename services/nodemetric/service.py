"""The nodemetric service shell: agent batches in, NodeMetricComputed out, the latest status projected to the DB.

Two durable consumers:
  * ingest (KOORD_NODE): decodes NodeMetricsReported / NodeStateReported, feeds each node's
    window (services.nodemetric.window), computes a report as soon as a batch crosses the
    node's report time (event time plus a stable per-node phase, so a replay computes the same
    reports with the same Nats-Msg-Id), publishes them per fetched batch, and records node
    liveness in the DB once per second. At start-up it is reset to replay the longest window,
    which rebuilds the in-memory windows; reports already projected are not emitted again.
  * projector (KOORD_NODEMETRIC): writes each NodeMetricComputed to the `node_metrics` table
    with its stream sequence, so a replay rebuilds exactly the same rows.
Called by the CLI (`koordbus up`, `koordbus service nodemetric`) and the integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery, Responder, msg_id
from bus.errors import BusError, PermanentError, TemporaryError
from schemas import names
from schemas.node import (
    NODE_EVENT_DECODER,
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricComputedRecord,
    NodeMetricsReported,
    NodeStateReported,
    TrainingRound,
)
from schemas.prediction import PredictionReply, PredictionRequest
from services.common import membership, observe
from services.common.membership import INSTANCE_DURABLE_INACTIVE_SECONDS, Membership
from services.common.tasks import cancel_and_wait
from services.nodemetric import snapshots
from services.nodemetric.core import PodInfo, effective_policy, report_phase
from services.nodemetric.predictor import MODEL_EXPIRATION_NS
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.snapshots import SnapshotWriter
from services.nodemetric.store import NodeMetricStore, NodeSeen
from services.nodemetric.training import NodePredictor, state_capacity
from services.nodemetric.window import NodeWindow, compute_status, due_report

log = logging.getLogger(__name__)
T = TypeVar("T")

# Fine enough that histogram_quantile (bench/nodemetric_ingest.py) resolves p50 and p99 around the 2 s target.
LATENCY_BUCKETS_SECONDS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0,
)  # fmt: skip
INGEST_CONSUMER = "nodemetric-ingest"
RPC_QUEUE = "nodemetric"
MODEL_EXPIRATION_SECONDS = MODEL_EXPIRATION_NS / 1e9
PROJECTOR_CONSUMER = "nodemetric-projector"
ROUNDS_PER_SLICE = 20
"""Training rounds applied between yields to the event loop when a snapshot applies the waiting ones (most of a
millisecond each at 100 pods: docs/benchmarks.md, "CPU per report with prediction on")."""
STOP_SNAPSHOT_SECONDS = 3.0
"""The snapshots saved at stop get this long (within the process's 8 s shutdown deadline, koordbus.runtime): with
the bus away they would wait on acknowledgements past it. What is not saved then is replayed by the next owner from
the samples since each node's last snapshot."""


def collect_policy(settings: NodeMetricSettings) -> MetricCollectPolicy:
    """The NodeMetric spec every node gets until per-node colocation strategies arrive (issue 3)."""
    return MetricCollectPolicy(
        aggregate_duration_seconds=settings.aggregate_duration_seconds,
        report_interval_seconds=settings.report_interval_seconds,
        durations_seconds=tuple(settings.aggregate_durations_seconds),
        node_memory_collect_policy=settings.node_memory_collect_policy,
    )


@dataclass
class _Instruments:
    batches: Counter
    reports: Counter
    latency: Histogram
    projection_latency: Histogram
    nodes: Gauge
    stale_nodes: Gauge
    unattributed_batches: Gauge
    partitions: Gauge
    rebalances: Counter
    training_rounds: Counter
    skipped_training_rounds: Counter
    snapshots: Counter
    restored_models: Counter
    unreadable_snapshots: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> _Instruments:
        return cls(
            batches=Counter(
                "koordbus_nodemetric_batches", "Agent metric batches applied to node windows", registry=registry
            ),
            reports=Counter("koordbus_nodemetric_reports", "NodeMetricComputed events published", registry=registry),
            latency=Histogram(
                "koordbus_nodemetric_ingest_latency_seconds",
                "From the agent's send time to the batch being in its node window with due reports published",
                buckets=LATENCY_BUCKETS_SECONDS,
                registry=registry,
            ),
            projection_latency=Histogram(
                "koordbus_nodemetric_projection_latency_seconds",
                "From the agent's send time of the batch that completed a report to its NodeMetric row being committed",
                buckets=LATENCY_BUCKETS_SECONDS,
                registry=registry,
            ),
            nodes=Gauge("koordbus_nodemetric_nodes", "Nodes with a window in memory", registry=registry),
            stale_nodes=Gauge(
                "koordbus_nodemetric_stale_nodes",
                "Nodes whose newest sample is older than stale_after_seconds",
                registry=registry,
            ),
            unattributed_batches=Gauge(
                "koordbus_nodemetric_unattributed_batches",
                "Batches (of nodes in memory) whose pod rows were dropped: they named a pod list by digest that "
                "this replica never received, e.g. right after it started mid-stream",
                registry=registry,
            ),
            partitions=Gauge(
                "koordbus_nodemetric_owned_partitions",
                "Node partitions this replica ingests (all of them without an instance name)",
                registry=registry,
            ),
            rebalances=Counter(
                "koordbus_nodemetric_rebalances",
                "Times this replica's share of the node partitions changed (a replica joined or left)",
                registry=registry,
            ),
            training_rounds=Counter(
                "koordbus_nodemetric_training_rounds",
                "Agent training rounds applied to the prod predictor's models (one per node and minute)",
                registry=registry,
            ),
            skipped_training_rounds=Counter(
                "koordbus_nodemetric_skipped_training_rounds",
                "Training rounds not applied: their batch named a pod list this replica never received",
                registry=registry,
            ),
            snapshots=Counter(
                "koordbus_nodemetric_prediction_snapshots",
                "Node model snapshots published to KOORD_PREDICTION",
                registry=registry,
            ),
            restored_models=Counter(
                "koordbus_nodemetric_prediction_restored_nodes",
                "Nodes whose models were restored from a snapshot (at start-up and on gaining partitions)",
                registry=registry,
            ),
            unreadable_snapshots=Counter(
                "koordbus_nodemetric_prediction_unreadable_snapshots",
                "Snapshots skipped at restore: they did not decode or fit the histograms (those nodes start cold)",
                registry=registry,
            ),
        )


def liveness_due(batch: NodeMetricsReported, *, grid: int) -> bool:
    """Whether this batch updates the node's liveness row: its end reaches a multiple of the liveness grid
    (window_start < k × grid <= window_end; event time alone decides, so a replay writes the same rows) or it
    reports dropped batches. A grid of 0 records every batch."""
    if not grid or batch.dropped_batches:
        return True
    return math.floor(batch.window_end / grid) > math.floor(batch.window_start / grid)


@dataclass
class _Pending:
    """What one fetched batch produced: reports to publish, how far each node was reported before it."""

    reports: list[NodeMetricComputed] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)
    reported_before: dict[str, float | None] = field(default_factory=dict)


class _IngestHandler:
    """Reports are computed per batch, as soon as a batch crosses a report time, so every round is reported and
    the result does not depend on how messages were grouped into fetches (a replay emits the same events)."""

    def __init__(self, owner: NodeMetricService) -> None:
        self._owner = owner
        self._decoder = NODE_EVENT_DECODER
        self._pending = _Pending()

    async def handle(self, delivery: Delivery) -> None:
        event = self._decoder.decode(delivery.data)
        if event.node != subjects.node_of(delivery.subject):  # the subject is the agent's own (its permissions)
            raise PermanentError(
                f"the event names node {names.shown(event.node)}, its subject {subjects.node_of(delivery.subject)!r}"
            )
        match event:
            case NodeMetricsReported():
                window = self._owner.window(event.node)
                self._pending.reported_before.setdefault(event.node, window.last_report)
                if window.add(event) and event.training is not None:
                    self._owner.train(event.node, event.training, window.added_pods())
                report = self._owner.due_report(event.node, window, sent_at=event.sent_at)
                if report is not None:
                    self._pending.reports.append(report)
                    window.mark_reported(report.report_time)
                if liveness_due(event, grid=self._owner.settings.liveness_grid_seconds):
                    seen = NodeSeen(node=event.node, window_end=event.window_end, dropped_batches=event.dropped_batches)
                    self._owner.node_rows.add((delivery.stream_seq, seen))
                self._pending.sent_at.append(event.sent_at)
            case NodeStateReported():
                self._owner.predictor(event.node).capacity = state_capacity(event)
                self._owner.node_rows.add((delivery.stream_seq, event))

    async def flush(self) -> None:
        pending, self._pending = self._pending, _Pending()
        try:
            await self._owner.publish_reports(pending.reports)
            if self._owner.node_rows.full:
                await self._owner.node_rows.write()  # backpressure: the database fell behind
        except Exception as e:  # the batch is redelivered: its reports must come due again
            for node, last_report in pending.reported_before.items():
                self._owner.window(node).rewind_report(last_report)
            if isinstance(e, TemporaryError):
                raise
            raise TemporaryError(f"nodemetric ingest flush failed: {e}", delay=1.0) from e
        self._owner.observe_applied(pending.sent_at)


class _BatchedWriter(Generic[T]):
    """Projection rows waiting for the database, written in one transaction at most once per interval.

    One transaction per interval instead of one per fetch: at 1,000 batches/s (and with reports spread over the
    interval, arriving one per fetch) the per-transaction cost dominated. Acking before the rows commit loses
    nothing: at every start-up the ingest consumer replays the longest window and the projector restarts from the
    database's own offset, so whatever was acked but not written is written again. The queue is bounded: past
    `limit` rows the consumer waits for a write (backpressure).
    """

    def __init__(self, name: str, write: Callable[[list[T]], Awaitable[object]], *, limit: int) -> None:
        self._name = name
        self._write = write
        self._limit = limit
        self._rows: list[T] = []
        self._writing = asyncio.Lock()
        self.failures = 0

    def add(self, row: T) -> None:
        self._rows.append(row)

    @property
    def full(self) -> bool:
        return len(self._rows) >= self._limit

    async def write(self) -> None:
        """Write the rows queued so far. One write at a time (the interval's, a full queue's, a rebalance's): rows
        written out of order would be lost, the store skipping what is at or below the offset a later write left."""
        async with self._writing:
            rows, self._rows = self._rows, []
            if not rows:
                return
            try:
                await self._write(rows)
            except BaseException as e:  # a cancelled write keeps its rows too, for close()
                self._rows = rows + self._rows  # kept for the next attempt (the store skips what it already has)
                if isinstance(e, Exception):
                    self.failures += 1
                raise

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.write()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("nodemetric: writing %d %s failed (will retry): %s", len(self._rows), self._name, e)

    async def close(self) -> None:
        """A last write at shutdown; what fails here is rewritten by the next start-up's replay."""
        try:
            await self.write()
        except Exception as e:
            log.warning("nodemetric: %d %s not written at shutdown: %s", len(self._rows), self._name, e)


class _ProjectorHandler:
    def __init__(self, rows: _BatchedWriter[tuple[int, NodeMetricComputedRecord, str]]) -> None:
        self._rows = rows
        self._decoder = msgspec.json.Decoder(NodeMetricComputedRecord)

    async def handle(self, delivery: Delivery) -> None:
        self._rows.add((delivery.stream_seq, self._decoder.decode(delivery.data), delivery.msg_id))

    async def flush(self) -> None:
        if self._rows.full:
            try:
                await self._rows.write()
            except Exception as e:
                raise TemporaryError(f"nodemetric projection failed: {e}", delay=1.0) from e


class NodeMetricService:
    """Owns the per-node windows and the two consumer loops."""

    def __init__(
        self,
        bus: Bus,
        store: NodeMetricStore,
        settings: NodeMetricSettings,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.store = store
        self.settings = settings
        self.spec = collect_policy(settings)
        self._clock = clock
        self._windows: dict[str, NodeWindow] = {}
        self._predictors: dict[str, NodePredictor] = {}
        self._rounds: dict[str, tuple[TrainingRound, list[PodInfo | None] | None]] = {}
        """Each node's training round received and not applied yet (see `train`), with the pods of its batch."""
        self._last_reports: dict[str, float] = {}
        self._projector: Consumer | None = None
        self._ingest: Consumer | None = None
        self._membership: Membership | None = None
        self._follower: asyncio.Task[None] | None = None
        self.owned: frozenset[int] | None = None
        """The node partitions this replica ingests; None: all of them (no instance name)."""
        self._registry = registry
        self._metrics = _Instruments.create(registry)
        self._phases: dict[str, int] = {}
        self.node_rows: _BatchedWriter[tuple[int, NodeSeen | NodeStateReported]] = _BatchedWriter(
            "node rows", self._write_node_rows, limit=settings.projection_max_pending
        )
        self.computed_rows: _BatchedWriter[tuple[int, NodeMetricComputedRecord, str]] = _BatchedWriter(
            "NodeMetric rows", self._write_computed_rows, limit=settings.projection_max_pending
        )
        self._writers: list[asyncio.Task[None]] = []
        self._snapshots = SnapshotWriter(bus)
        self._responders: list[Responder] = []

    def window(self, node: str) -> NodeWindow:
        window = self._windows.get(node)
        if window is None:
            phase = report_phase(
                node,
                interval=effective_policy(self.spec).report_interval_seconds,
                step=self.settings.report_phase_step_seconds,
            )
            window = NodeWindow(self.spec, phase=phase, last_report=self._last_reports.get(node))
            self._windows[node] = window
            self._phases[node] = phase
            self._metrics.nodes.set(len(self._windows))
        return window

    def predictor(self, node: str) -> NodePredictor:
        """The node's predictor with every training round received applied (made when the node has none)."""
        self._catch_up(node)
        return self._entry(node)

    def _entry(self, node: str) -> NodePredictor:
        predictor = self._predictors.get(node)
        if predictor is None:
            predictor = self._predictors[node] = NodePredictor()
        return predictor

    def train(self, node: str, round_: TrainingRound, pods: list[PodInfo | None] | None) -> None:
        """Take one of the node's training rounds (services.nodemetric.training). It is applied when the node's
        models are read next (its next report, a prediction request, a snapshot) or its next round arrives, not
        now: every agent ends its round on the same minute, so applying each on arrival trained every node within
        the same 10 s window, which cost about twice the CPU of the others and at 10,000 nodes backed the ingest up
        once a minute (docs/benchmarks.md); the nodes' reports, and so the reads, are spread over the minute by their
        phases. A report reads the same models either way: the rounds that arrived before it."""
        self._catch_up(node)
        self._rounds[node] = (round_, pods)

    def _catch_up(self, node: str) -> None:
        """Apply the node's waiting training round, if it has one."""
        waiting = self._rounds.pop(node, None)
        if waiting is None:
            return
        round_, pods = waiting
        predictor = self._entry(node)
        skipped_before = predictor.skipped_rounds
        if predictor.train(round_, pods):
            self._metrics.training_rounds.inc()
        elif predictor.skipped_rounds > skipped_before:
            self._metrics.skipped_training_rounds.inc()

    async def _apply_rounds(self, part: int | None) -> None:
        """Apply the rounds waiting for the nodes of snapshot `part` (None: every node), yielding to the event loop
        every ROUNDS_PER_SLICE nodes."""
        waiting = [n for n in self._rounds if part is None or snapshots.part_of(n, self._snapshots.parts) == part]
        for i, node in enumerate(waiting, 1):
            self._catch_up(node)  # nothing, when ingest applied it while this yielded
            if i % ROUNDS_PER_SLICE == 0:
                await asyncio.sleep(0)

    async def start(self) -> None:
        """Load how far each node was reported, then start both consumers (ingest replays the longest window).
        A replica with an instance name first joins the members and ingests only the partitions it owns, then
        follows the members: a partition it gains is replayed like a start-up, one it loses is dropped."""
        self._last_reports = await self.store.last_report_times()
        projected = await self.store.offset(self._projector_name)
        projector = ConsumerSpec(
            durable=self._projector_name,
            stream=streams.KOORD_NODEMETRIC,
            filter_subjects=(subjects.NODEMETRIC_COMPUTED_ALL,),
            service="nodemetric",
            batch_size=self.settings.ingest_batch_size,
            # The database, not the durable, knows what is projected: a fresh database replays the whole stream.
            deliver_policy="by_start_sequence",
            opt_start_seq=projected + 1,
            inactive_threshold_seconds=INSTANCE_DURABLE_INACTIVE_SECONDS if self.settings.instance else None,
            retry_flush_in_place=True,  # the store skips sequences below its offset
        )
        interval = self.settings.projection_write_interval_seconds
        self._writers = [
            asyncio.create_task(self.node_rows.run(interval), name="nodemetric-node-rows"),
            asyncio.create_task(self.computed_rows.run(interval), name="nodemetric-computed-rows"),
            asyncio.create_task(self._snapshot_loop(), name="nodemetric-prediction-snapshots"),
        ]
        self._projector = self.bus.consume(projector, _ProjectorHandler(self.computed_rows), reset=True)
        owned: frozenset[int] | None = None
        if self.settings.instance:
            self._membership = Membership(
                self.bus,
                service="nodemetric",
                instance=self.settings.instance,
                ttl_seconds=self.settings.membership_ttl_seconds,
                clock=self._clock,
            )
            owned = await self._membership.join()
            self._follower = asyncio.create_task(
                self._membership.follow(lambda: self.owned, self._rebalance), name="nodemetric-members"
            )
        await self._restore_predictors(owned)
        self._start_ingest(owned)
        await self._serve_predictions(owned)

    def _start_ingest(self, owned: frozenset[int] | None) -> None:
        """The ingest consumer for `owned` partitions (None: all), replaying the longest window."""
        history = max((*self.spec.durations_seconds, self.spec.aggregate_duration_seconds))
        replay_from = self._clock() - history - self.settings.replay_slack_seconds
        every = (subjects.NODE_METRICS_ALL, subjects.NODE_STATE_ALL)
        filters = every if owned is None else tuple(f for e in every for f in subjects.partition_filters(e, owned))
        self.owned = owned
        self._metrics.partitions.set(subjects.NODE_PARTITIONS if owned is None else len(owned))
        self._ingest = None
        if filters:
            ingest = ConsumerSpec(
                durable=self._ingest_name,
                stream=streams.KOORD_NODE,
                filter_subjects=filters,
                service="nodemetric",
                batch_size=self.settings.ingest_batch_size,
                deliver_policy="by_start_time",
                opt_start_time=max(replay_from, 0.0),
                inactive_threshold_seconds=INSTANCE_DURABLE_INACTIVE_SECONDS if self.settings.instance else None,
                retry_flush_in_place=True,  # the store skips sequences below each partition's offset
            )
            self._ingest = self.bus.consume(ingest, _IngestHandler(self), reset=True)
        watched = {PROJECTOR_CONSUMER: self._projector} if self._projector is not None else {}
        if self._ingest is not None:
            watched[INGEST_CONSUMER] = self._ingest
        observe.watch_consumers(self._registry, service="nodemetric", consumers=watched)

    async def _rebalance(self, owned: frozenset[int]) -> None:
        """Ingest `owned` from now on: the windows are rebuilt by replaying the longest window, as at start-up
        (reports already made are skipped, recent ones deduplicated by their msg ids)."""
        log.info("nodemetric %s: partitions %s → %s", self.settings.instance, sorted(self.owned or ()), sorted(owned))
        if self._ingest is not None:
            await self._ingest.stop()
        await self.node_rows.write()
        await self.save_snapshots()  # the freshest models for whichever replica takes a node over
        self._windows.clear()
        self._predictors.clear()
        self._rounds.clear()
        self._snapshots.forget()
        self._phases.clear()
        self._last_reports = await self.store.last_report_times()
        await self._restore_predictors(owned)
        self._start_ingest(owned)
        await self._serve_predictions(owned)
        self._metrics.rebalances.inc()

    async def stop(self) -> None:
        if self._follower is not None:
            await cancel_and_wait(self._follower)
            self._follower = None
        await self._serve_predictions(frozenset())
        for consumer in (self._projector, self._ingest):
            if consumer is not None:
                await consumer.stop()
        if self._writers:
            await self._save_snapshots_at_stop()
        if self._membership is not None:
            with contextlib.suppress(Exception):  # the others then notice by the TTL instead
                await self._membership.leave()
            self._membership = None
        for task in self._writers:
            await cancel_and_wait(task)
        if self._writers:
            await self.node_rows.close()
            await self.computed_rows.close()
        self._writers = []
        if self._projector is not None:
            observe.retire_consumers(self._registry, service="nodemetric", names=(PROJECTOR_CONSUMER, INGEST_CONSUMER))
        self._projector = self._ingest = None

    async def _restore_predictors(self, owned: frozenset[int] | None) -> None:
        """The owned nodes' models from their last snapshots (services.nodemetric.snapshots), before the replay."""
        try:
            restored = await snapshots.restore(self.bus, owned)
        except BusError as e:  # the replay still trains what it holds: cold, not stopped
            log.warning("nodemetric: prediction snapshots not read, the owned nodes' models start cold: %s", e)
            return
        self._predictors.update(restored.predictors)
        self._snapshots.saved.update({node: p.trained_until or 0.0 for node, p in restored.predictors.items()})
        self._metrics.restored_models.inc(len(restored.predictors))
        self._metrics.unreadable_snapshots.inc(restored.unreadable)
        log.info(
            "nodemetric: prod-predictor models of %d nodes restored from their snapshots (%d unreadable)",
            len(restored.predictors),
            restored.unreadable,
        )

    async def _serve_predictions(self, owned: frozenset[int] | None) -> None:
        """Answer the API's prediction requests for the nodes of the `owned` partitions (None: every node)."""
        for responder in self._responders:
            await responder.stop()
        partitions: list[int | str] = ["*"] if owned is None else sorted(owned)
        self._responders = [
            await self.bus.serve(subjects.nodemetric_rpc_prediction(p), self.prediction, queue=RPC_QUEUE)
            for p in partitions
        ]

    async def prediction(self, data: bytes) -> bytes:
        """One node's predictor as this replica holds it (schemas.prediction.PredictionReply)."""
        try:
            request = msgspec.json.decode(data, type=PredictionRequest)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return msgspec.json.encode(PredictionReply(error=f"not a PredictionRequest: {e}"))
        self._catch_up(request.node)
        predictor = self._predictors.get(request.node)
        if predictor is None or predictor.trained_until is None:  # a node state alone makes an untrained predictor
            return msgspec.json.encode(PredictionReply())
        window = self._windows.get(request.node)
        last = None
        if window is not None and window.last_report is not None and predictor.trained_until is not None:
            last = predictor.predict(window.last_report, window.current_pods())  # what the newest report said
        return msgspec.json.encode(PredictionReply(view=predictor.view(request.node, last)))

    async def save_snapshots(self, part: int | None = None, *, apply_waiting: bool = True) -> None:
        """Snapshot the models trained since their last snapshot (only the nodes of `part` when given, as the
        periodic loop does: services.nodemetric.snapshots), the rounds waiting for them applied first unless
        `apply_waiting` is False; a bus failure is logged and retried next time. A node not trained for longer than
        the models' expiration (its agent is gone) is forgotten first: every one of its models would have expired
        at its next round anyway."""
        if apply_waiting:
            await self._apply_rounds(part)
        now = self._clock()
        idle_since = now - MODEL_EXPIRATION_SECONDS
        for node in [n for n, p in self._predictors.items() if (p.trained_until or now) < idle_since]:
            del self._predictors[node]
            self._snapshots.saved.pop(node, None)
        try:
            self._metrics.snapshots.inc(await self._snapshots.save(self._predictors, now=now, part=part))
        except BusError as e:
            log.warning("nodemetric: prediction snapshots not saved (next try in one interval): %s", e)

    async def _save_snapshots_at_stop(self) -> None:
        try:
            # The waiting rounds are left to the next owner's replay: applying up to one per node (10,000 nodes
            # right after a minute) would take the time the snapshots need.
            await asyncio.wait_for(self.save_snapshots(apply_waiting=False), STOP_SNAPSHOT_SECONDS)
        except TimeoutError:
            log.warning(
                "nodemetric: prediction snapshots at stop not saved within %g s (is the bus away?); the next owner "
                "replays the samples since each node's last snapshot",
                STOP_SNAPSHOT_SECONDS,
            )

    async def _snapshot_loop(self) -> None:
        """One part of the nodes every interval / parts: each node once per interval, in short slices."""
        parts = self._snapshots.parts
        for tick in itertools.count():
            await asyncio.sleep(self.settings.snapshot_interval_seconds / parts)
            await self.save_snapshots(part=tick % parts)

    @property
    def _ingest_name(self) -> str:
        return membership.durable(INGEST_CONSUMER, self.settings.instance)

    @property
    def _projector_name(self) -> str:
        """Every replica projects every report (upserts keep the newest per node: idempotent across replicas)."""
        return membership.durable(PROJECTOR_CONSUMER, self.settings.instance)

    async def _write_node_rows(self, rows: list[tuple[int, NodeSeen | NodeStateReported]]) -> None:
        # Offsets per partition, not per replica: see NodeMetricStore.apply_node_events.
        await self.store.apply_node_events(
            rows, consumer=INGEST_CONSUMER, stream=streams.KOORD_NODE, partition=subjects.node_partition
        )

    async def _write_computed_rows(self, rows: list[tuple[int, NodeMetricComputedRecord, str]]) -> None:
        await self.store.apply_computed(
            [(seq, event) for seq, event, _ in rows],
            consumer=self._projector_name,
            stream=streams.KOORD_NODEMETRIC,
            msg_ids={seq: mid for seq, _, mid in rows},
        )
        now = self._clock()
        for _, event, _ in rows:
            if event.source_sent_at:
                self._metrics.projection_latency.observe(max(now - event.source_sent_at, 0.0))

    @property
    def consumers(self) -> list[Consumer]:
        """The projector, then the ingest (none while a replica owns no partition)."""
        return [c for c in (self._projector, self._ingest) if c is not None]

    def due_report(self, node: str, window: NodeWindow, *, sent_at: float) -> NodeMetricComputed | None:
        """The report this node's window has just reached, if any."""
        report_time = due_report(window, spec=self.spec, phase=self._phases[node])
        if report_time is None:
            return None
        status = compute_status(window, report_time=report_time, spec=self.spec)
        self._catch_up(node)
        predictor = self._predictors.get(node)
        if predictor is not None and predictor.trained_until is not None:
            prediction = predictor.predict(report_time, window.current_pods(), explain=False)
            status = msgspec.structs.replace(status, prod_reclaimable=prediction.reclaimable, prod_peak=prediction.peak)
        return NodeMetricComputed(
            node=node,
            report_time=report_time,
            spec=self.spec,
            status=status,
            source_sent_at=sent_at,
            psi=window.psi_metric(report_time),
        )

    async def publish_reports(self, reports: list[NodeMetricComputed]) -> None:
        if not reports:
            return
        await self.bus.publish_many(
            [
                (
                    subjects.nodemetric_computed(event.node),
                    msgspec.json.encode(event),
                    msg_id("nodemetric.computed", event.node, event.report_time),
                )
                for event in reports
            ]
        )
        self._metrics.reports.inc(len(reports))

    def observe_applied(self, sent_at: list[float]) -> None:
        now = self._clock()
        for t in sent_at:
            self._metrics.latency.observe(max(now - t, 0.0))
        self._metrics.batches.inc(len(sent_at))

    def refresh_gauges(self) -> None:
        """Recount stale nodes (wall clock); called by the API's /metrics handler and the CLI's ticker."""
        cutoff = self._clock() - self.settings.stale_after_seconds
        self._metrics.stale_nodes.set(sum(1 for w in self._windows.values() if (w.newest_end or 0.0) < cutoff))
        self._metrics.unattributed_batches.set(sum(w.unattributed_batches for w in self._windows.values()))
