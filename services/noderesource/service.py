"""The noderesource service shell: cluster state and NodeMetrics in, one NodeResourceComputed per node decision out.

Consumers (durable pull, all reset at start so their deliver policy applies again):
  * history (KOORD_NODERESOURCE, last decision per node, start-up only): seeds, per node, the last published
    decision and the hysteresis baseline, so a restart neither forgets when a node was last written nor
    republishes a decision identical to the last one (the content-derived msg id also deduplicates it).
  * cluster (KOORD_CLUSTER nodes, pods and the slo-controller-config ConfigMap) and nodemetric (KOORD_NODEMETRIC
    computed): replay the last message per subject, which is the current state, then follow new messages.
  * projector (KOORD_NODERESOURCE, every decision, only with a store): writes each decision to the store from the
    database's own offset (one transaction per fetched batch), so a fresh database replays the whole stream.
Each event goes into services.noderesource.state.ClusterState; after each fetched batch the nodes it touched are
decided once each and the decisions published on `koord.v1.noderesource.<node>.computed`. Nothing is decided
until the start-up replay is done (deciding from half a cluster would publish wrong values). A resync tick decides
every node again with the clock's time, so a NodeMetric that stops arriving degrades its node after
degradeTimeMinutes and due writes recur after updateTimeThresholdSeconds. Decode errors are dead-lettered by the
bus loop; events that decode but cannot be used (older versions, pods of unknown nodes, a bad config) are counted
by reason and skipped. With a store, the service also records the colocation config in effect (and the ConfigMap's
error) and each node's effective strategy whenever they change, for GET /api/v1/config/colocation; those are
current state, not a projection, so a failed write is retried after the next batch or tick. Called by the CLI and
the integration tests.

Scale-out: a replica with an instance name joins the noderesource members (services.common.membership) and decides
only the nodes of the partitions it owns. Its nodemetric consumer filters on those partitions (KOORD_NODEMETRIC
stores each report under its node's partition); the cluster stream is not partitioned (pods are named by namespace),
so every replica reads all of it and keeps only what concerns its nodes (ClusterState.concerns). When its share
changes it forgets the nodes it lost and, for those it gained, reads their last decisions and replays the current
cluster state and NodeMetrics, as at start-up, deciding them only once that replay is done; the nodes it kept are
decided throughout. A gained node's first decision is compared with the last one its previous owner published (so
nothing unchanged is published again), and decisions derive their time from the triggering event and their msg id
from what they decide (`decision_identity`), so two replicas that briefly both own a partition publish one message,
which JetStream deduplicates; a NodeMetric the previous owner consumed but never decided is replayed and decided by
the new one. Two such replicas can still decide a node from different views (one saw the other's last decision):
each decision is published conditional on the last sequence of the node's subject its replica knows, so the one
with the older view is refused, takes the stream's last decision as the one published and decides the node again.
Every replica projects every decision under the one store offset of PROJECTOR_CONSUMER: the database serializes
the writes and skips what another replica already wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery, msg_id
from bus.errors import TemporaryError
from schemas.cluster import CLUSTER_EVENT_DECODER
from schemas.node import NodeMetricComputed
from schemas.noderesource import (
    COLOCATION_CONFIG_STATUS_DECODER,
    NODERESOURCE_COMPUTED_DECODER,
    ColocationConfigStatus,
    NodeResourceComputed,
    Trigger,
)
from services.common import membership, observe
from services.common.membership import INSTANCE_DURABLE_INACTIVE_SECONDS, Membership
from services.common.projection import BatchProjector
from services.common.startup import wait_replayed
from services.common.tasks import cancel_and_wait
from services.noderesource import config as colocation
from services.noderesource import core
from services.noderesource.settings import NodeResourceSettings
from services.noderesource.state import (
    PROBLEM_CONFIG_ERROR,
    ClusterState,
    LastWrite,
    StateEvent,
    decision_identity,
    decision_time,
    event_time,
    is_repeat,
    last_write_after,
    trigger_of,
)
from services.noderesource.store import NodeResourceStore, NodeStrategyRecord

log = logging.getLogger(__name__)

SERVICE = "noderesource"
CLUSTER_CONSUMER = "noderesource-cluster"
NODEMETRIC_CONSUMER = "noderesource-nodemetric"
HISTORY_CONSUMER = "noderesource-history"
PROJECTOR_CONSUMER = "noderesource-projector"
STRATEGY_TRIGGERS: frozenset[Trigger] = frozenset({"node", "config"})
"""A node's effective strategy depends only on the config and the node's labels and annotations."""
SKIP_UNKNOWN_NODE = "unknown_node"
PUBLISH_RETRY_DELAY_SECONDS = 1.0
YIELD_EVERY_DECISIONS = 200
"""A decision with 100 pods costs about 0.15 ms; the event loop gets a turn after this many (~30 ms)."""
STOP_PROJECTION_SECONDS = 2.0
"""The most a stop spends, in all, letting a decision under way finish and the projector write the decisions
published last (the process has 8 s to stop every part: nothing here may wait on a bus that has gone)."""
PUBLISH_ROUNDS = 3
"""A decision refused (another replica decided the node meanwhile) is decided again from what the stream holds;
after this many rounds in one batch, the node waits for the next batch or tick."""


DECISION_REASONS: Final = {
    "": "none",
    core.REASON_DISABLED: "DisableInConfig",
    core.REASON_BATCH_DEGRADED: "degradedByBatchResource",
    core.REASON_MID_DEGRADED: "degradedByMidResource",
}
"""A decision's reason → the `reason` label (Koordinator's reason token); any other text counts as "other"."""


@dataclass
class _Instruments:
    recomputations: Counter
    decisions: Counter
    published: Counter
    repeats: Counter
    writes_due: Counter
    degraded_nodes: Gauge
    config_errors: Counter
    skipped_inputs: Counter
    partitions: Gauge
    rebalances: Counter
    refused: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> _Instruments:
        return cls(
            recomputations=Counter(
                "koordbus_noderesource_recomputations", "Node decisions computed", registry=registry
            ),
            decisions=Counter(
                "koordbus_noderesource_decisions",
                "Node decisions computed, by outcome (computed, degraded: NodeMetric missing or stale, disabled: "
                "colocation off) and Koordinator's reason (none, DisableInConfig, degradedByBatchResource …)",
                ["outcome", "reason"],
                registry=registry,
            ),
            published=Counter(
                "koordbus_noderesource_decisions_published",
                "NodeResourceComputed events stored (duplicates of an earlier msg id not counted)",
                registry=registry,
            ),
            repeats=Counter(
                "koordbus_noderesource_decisions_unchanged",
                "Decisions not published: same resources and outcome as the previous one, no write due",
                registry=registry,
            ),
            writes_due=Counter(
                "koordbus_noderesource_writes_due", "Published decisions whose node write is due", registry=registry
            ),
            degraded_nodes=Gauge(
                "koordbus_noderesource_degraded_nodes",
                "Nodes whose latest decision is degraded (NodeMetric missing or stale)",
                registry=registry,
            ),
            config_errors=Counter(
                "koordbus_noderesource_config_errors",
                "slo-controller-config contents rejected (the previous configuration stays in effect)",
                registry=registry,
            ),
            skipped_inputs=Counter(
                "koordbus_noderesource_skipped_inputs",
                "Events that decoded but could not be used, by reason",
                ["reason"],
                registry=registry,
            ),
            partitions=Gauge(
                "koordbus_noderesource_owned_partitions",
                "Node partitions this replica decides (all of them without an instance name)",
                registry=registry,
            ),
            rebalances=Counter(
                "koordbus_noderesource_rebalances",
                "Times this replica's share of the node partitions changed (a replica joined or left)",
                registry=registry,
            ),
            refused=Counter(
                "koordbus_noderesource_decisions_refused",
                "Decisions the stream refused because another replica had decided the node since this one last "
                "saw it (a partition moving); the node is decided again from the stream's last decision",
                registry=registry,
            ),
        )


@dataclass
class _Dirty:
    """A node to decide again: what changed, and the newest time of the events that changed it."""

    triggers: set[Trigger] = field(default_factory=set)
    time: float = 0.0


class _StateHandler:
    """Feeds cluster or NodeMetric events into the state; decides the touched nodes once per fetched batch."""

    def __init__(self, owner: NodeResourceService, decode: Callable[[bytes], StateEvent]) -> None:
        self._owner = owner
        self._decode = decode

    async def handle(self, delivery: Delivery) -> None:
        self._owner.apply(self._decode(delivery.data))

    async def flush(self) -> None:
        await self._owner.decide_pending()


class _HistoryHandler:
    def __init__(self, owner: NodeResourceService) -> None:
        self._owner = owner

    async def handle(self, delivery: Delivery) -> None:
        self._owner.remember(NODERESOURCE_COMPUTED_DECODER.decode(delivery.data), seq=delivery.stream_seq)

    async def flush(self) -> None:
        return None


_NODEMETRIC_DECODER = msgspec.json.Decoder(NodeMetricComputed)


class NodeResourceService:
    """Owns the cluster state, the per-node decision records, the consumers and the resync tick."""

    def __init__(
        self,
        bus: Bus,
        settings: NodeResourceSettings,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        store: NodeResourceStore | None = None,
    ) -> None:
        """`store` None: no projection and no config recording (tests that only look at the stream)."""
        self.bus = bus
        self.settings = settings
        self.store = store
        self.state = ClusterState(smoothing=settings.smoothing())
        self._clock = clock
        self._registry = registry
        self._metrics = _Instruments.create(registry)
        self._decided_at: dict[str, float] = {}
        """Per node, the clock's time of its last decision (published or not): what the resync tick skips."""
        self._published: dict[str, NodeResourceComputed] = {}
        """Per node, the last decision published (or found in the stream at start-up)."""
        self._subject_seq: dict[str, int] = {}
        """Per node, the stream sequence of the last decision on its subject as far as this replica knows: what its
        next decision is published conditional on, so a replica that missed another's decision of the node cannot
        publish over it (0: none known)."""
        self._last_written: dict[str, LastWrite] = {}
        self._metrics.degraded_nodes.set_function(
            lambda: sum(1 for d in self._published.values() if d.outcome == "degraded")  # counted when scraped
        )
        self._dirty: dict[str, _Dirty] = {}
        self._ready = False
        self._lock = asyncio.Lock()
        self._consumers: dict[str, Consumer] = {}
        """The cluster and nodemetric consumers by name (no nodemetric consumer while no partition is owned)."""
        self._ticker: asyncio.Task[None] | None = None
        self._membership: Membership | None = None
        self._follower: asyncio.Task[None] | None = None
        self.owned: frozenset[int] | None = None
        """The node partitions whose nodes this replica takes in and decides; None: all of them (no instance)."""
        self._settled: frozenset[int] | None = None
        """The share whose replay is done (what the members are compared with: a rebalance cut short is retried)."""
        self._held: frozenset[int] = frozenset()
        """Partitions gained whose replay is not done yet: their nodes are not decided until it is."""
        self._partition_of: dict[str, int] = {}
        self._projector: Consumer | None = None
        self._recorded_config: colocation.ColocationConfigState | None = None
        """The config state last written to the store (None: not yet)."""
        self._node_strategies: dict[str, NodeStrategyRecord] = {}
        """Per known node, its effective strategy as last computed."""
        self._unrecorded_strategies: set[str] = set()
        self._config_status: ColocationConfigStatus | None = None
        """The last ColocationConfigStatus published (None: not yet read back from the stream after start-up)."""
        """Nodes whose strategy (or removal) is not yet written to the store."""

    # --- lifecycle

    async def start(self) -> None:
        """Read the last decisions, replay the current cluster state and NodeMetrics, decide every node they
        touched, then follow new events and start the resync tick. A replica with an instance name first joins
        the members and does all this for the nodes of its share only, then follows the members."""
        if (store := self.store) is not None:
            projected = await store.offset(PROJECTOR_CONSUMER)

            async def write(batch: list[tuple[int, NodeResourceComputed, str]]) -> None:
                await store.apply_decisions(
                    [(seq, decision) for seq, decision, _ in batch],
                    consumer=PROJECTOR_CONSUMER,  # one offset for every replica: each decision is written once
                    stream=streams.KOORD_NODERESOURCE,
                    msg_ids={seq: mid for seq, _, mid in batch if mid},
                )

            projector = BatchProjector(
                "noderesource",
                lambda d: (d.stream_seq, NODERESOURCE_COMPUTED_DECODER.decode(d.data), d.msg_id),
                write,
            )
            self._projector = self.bus.consume(self._projector_spec(projected), projector, reset=True)
            observe.watch_consumers(self._registry, service=SERVICE, consumers={PROJECTOR_CONSUMER: self._projector})
        if self.settings.instance:
            self._membership = Membership(
                self.bus,
                service=SERVICE,
                instance=self.settings.instance,
                ttl_seconds=self.settings.membership_ttl_seconds,
                clock=self._clock,
            )
            self.owned = await self._membership.join()
        self._metrics.partitions.set(subjects.NODE_PARTITIONS if self.owned is None else len(self.owned))
        await self._read_last_decisions()
        await self._replay_state()
        async with self._lock:
            configmap_time = self._clock()
            for node in self.state.assume_configmap_absent():
                self._mark(node, "config", configmap_time)
            self._ready = True
            try:
                await self._decide(self._take_dirty())
            except TemporaryError as e:
                log.warning("noderesource: first decisions not published, the resync retries: %s", e)
        self._settled = self.owned
        self._ticker = asyncio.create_task(self._tick(), name="noderesource-resync")
        if self._membership is not None:
            self._follower = asyncio.create_task(
                self._membership.follow(lambda: self._settled, self._rebalance), name="noderesource-members"
            )

    async def _read_last_decisions(self) -> None:
        """Seed the records of the nodes held from their last decisions on KOORD_NODERESOURCE."""
        timeout = self.settings.startup_timeout_seconds
        history = self.bus.consume(self._spec(HISTORY_CONSUMER), _HistoryHandler(self), reset=True)
        observe.watch_consumers(self._registry, service=SERVICE, consumers={HISTORY_CONSUMER: history})
        try:
            if not await wait_replayed(history, what="noderesource: last decisions", stall_seconds=timeout):
                log.warning("noderesource: last decisions stalled for %.0f s, starting without the rest", timeout)
        finally:
            await history.stop()
            observe.retire_consumers(self._registry, service=SERVICE, names=(HISTORY_CONSUMER,))  # replay counted

    async def _replay_state(self) -> None:
        """Start the cluster and nodemetric consumers (their replay is the current state) and wait for the replay."""
        timeout = self.settings.startup_timeout_seconds
        decoders: dict[str, Callable[[bytes], StateEvent]] = {
            CLUSTER_CONSUMER: CLUSTER_EVENT_DECODER.decode,
            NODEMETRIC_CONSUMER: _NODEMETRIC_DECODER.decode,
        }
        self._consumers = {
            name: self.bus.consume(spec, _StateHandler(self, decode), reset=True)
            for name, decode in decoders.items()
            if (spec := self._spec(name)).filter_subjects  # a replica owning no partition reads no NodeMetric
        }
        observe.watch_consumers(self._registry, service=SERVICE, consumers=self._consumers)
        for name, consumer in self._consumers.items():
            if not await wait_replayed(consumer, what=f"noderesource: {name}", stall_seconds=timeout):
                log.warning(
                    "noderesource: start-up replay not finished within %.0f s without progress, deciding anyway",
                    timeout,
                )

    async def _stop_state_consumers(self) -> None:
        for consumer in self._consumers.values():
            await consumer.stop()
        if self._consumers:
            observe.retire_consumers(self._registry, service=SERVICE, names=tuple(self._consumers))
        self._consumers = {}

    async def _rebalance(self, owned: frozenset[int]) -> None:
        """Decide the nodes of `owned` from now on: forget the nodes lost, and for those gained read their last
        decisions and replay the current state as at start-up; they are decided once the replay is done."""
        gained = owned - (self._settled or frozenset())
        log.info(
            "noderesource %s: partitions %s → %s", self.settings.instance, sorted(self._settled or ()), sorted(owned)
        )
        await self._stop_state_consumers()
        async with self._lock:
            self.owned, self._held = owned, gained
            self._forget_unowned()
        self._metrics.partitions.set(len(owned))
        if gained:
            await self._read_last_decisions()
        await self._replay_state()
        async with self._lock:
            self._held = frozenset()
            self._settled = owned
            self._metrics.rebalances.inc()
            await self._decide(self._take_dirty())

    def _forget_unowned(self) -> None:
        """Drop what this replica holds of the nodes it no longer owns (their new owner records and decides them)."""
        self.state.retain(self._owns)
        for records in (
            self._published,
            self._subject_seq,
            self._last_written,
            self._decided_at,
            self._dirty,
            self._node_strategies,
        ):
            for node in [n for n in records if not self._owns(n)]:
                del records[node]
        self._unrecorded_strategies = {n for n in self._unrecorded_strategies if self._owns(n)}

    def _owns(self, node: str) -> bool:
        """Whether `node` is in this replica's share (always, without an instance name)."""
        return self.owned is None or self._partition(node) in self.owned

    def _partition(self, node: str) -> int:
        partition = self._partition_of.get(node)
        if partition is None:
            partition = self._partition_of[node] = subjects.node_partition(node)
        return partition

    async def stop(self) -> None:
        if self._follower is not None:
            await cancel_and_wait(self._follower)
            self._follower = None
        give_up_at = asyncio.get_running_loop().time() + STOP_PROJECTION_SECONDS
        if self._ticker is not None:
            # Between decisions where it can (a tick's publish finishes rather than being cut off in flight), but
            # not waiting on a decision stuck on an absent bus.
            held = False
            if self.bus.connected:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(give_up_at):
                        held = await self._lock.acquire()
            try:
                await cancel_and_wait(self._ticker)
            finally:
                if held:
                    self._lock.release()
            self._ticker = None
        await self._stop_state_consumers()
        if self._projector is not None:
            # Nothing is decided any more: project what was published last (a tick's decisions as the stop came)
            # before going, so a clean stop leaves no decision of this replica unprojected; bounded, as the bus may
            # be away (the next start projects the rest from the database's offset): not at all without it.
            if self.bus.connected:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(give_up_at):
                        await self._projector.wait_idle(STOP_PROJECTION_SECONDS)
            await self._projector.stop()
            observe.retire_consumers(self._registry, service=SERVICE, names=(PROJECTOR_CONSUMER,))
            self._projector = None
        if self._membership is not None:
            with contextlib.suppress(Exception):  # the others then notice by the TTL instead
                await self._membership.leave()
            self._membership = None
        self._ready = False

    def _projector_spec(self, projected: int) -> ConsumerSpec:
        return ConsumerSpec(
            durable=membership.durable(PROJECTOR_CONSUMER, self.settings.instance),
            inactive_threshold_seconds=self._inactive_threshold,
            stream=streams.KOORD_NODERESOURCE,
            filter_subjects=(subjects.NODERESOURCE_COMPUTED_ALL,),
            service=SERVICE,
            batch_size=self.settings.batch_size,
            linger_seconds=self.settings.projection_linger_seconds,
            # The database, not the durable, knows what is projected: a fresh database replays the whole stream.
            deliver_policy="by_start_sequence",
            opt_start_seq=projected + 1,
            retry_flush_in_place=True,  # the store skips sequences below its offset
        )

    def _spec(self, durable: str) -> ConsumerSpec:
        stream, filters = {
            HISTORY_CONSUMER: (streams.KOORD_NODERESOURCE, (subjects.NODERESOURCE_COMPUTED_ALL,)),
            CLUSTER_CONSUMER: (
                streams.KOORD_CLUSTER,
                (
                    subjects.CLUSTER_NODES,
                    subjects.CLUSTER_PODS,
                    subjects.CLUSTER_TOPOLOGIES,
                    subjects.cluster_configmap(colocation.CONFIGMAP_NAMESPACE, colocation.CONFIGMAP_NAME),
                ),
            ),
            NODEMETRIC_CONSUMER: (
                streams.KOORD_NODEMETRIC,
                (subjects.NODEMETRIC_COMPUTED_ALL,)
                if self.owned is None
                else subjects.partition_filters(subjects.NODEMETRIC_COMPUTED_ALL, self.owned),
            ),
        }[durable]
        return ConsumerSpec(
            durable=membership.durable(durable, self.settings.instance),
            inactive_threshold_seconds=self._inactive_threshold,
            stream=stream,
            filter_subjects=filters,
            service=SERVICE,
            batch_size=self.settings.batch_size,
            linger_seconds=0.0 if durable == HISTORY_CONSUMER else self.settings.decide_linger_seconds,
            deliver_policy="last_per_subject",
        )

    @property
    def _inactive_threshold(self) -> float | None:
        return INSTANCE_DURABLE_INACTIVE_SECONDS if self.settings.instance else None

    @property
    def consumers(self) -> list[Consumer]:
        """The cluster and nodemetric consumers, then the projector when there is a store."""
        return [*self._consumers.values(), *([self._projector] if self._projector is not None else [])]

    @property
    def ready(self) -> bool:
        """True once the start-up replay is decided and new events are followed."""
        return self._ready

    def last_decision(self, node: str) -> NodeResourceComputed | None:
        return self._published.get(node)

    # --- events

    def apply(self, event: StateEvent) -> None:
        """Take one event into the state and mark the nodes it touches (a replica: only what concerns its share)."""
        if self.owned is not None and not self.state.concerns(event, self._owns):
            return
        nodes = self.state.apply(event)
        self._count_problems()
        trigger, at = trigger_of(event), event_time(event)
        for node in nodes:
            if self._owns(node):
                self._mark(node, trigger, at)

    def remember(self, decision: NodeResourceComputed, *, seq: int) -> None:
        """Seed a node's records from a decision found in the stream at `seq` (start-up, or a node gained)."""
        if not self._owns(decision.node):
            return
        self._subject_seq[decision.node] = max(seq, self._subject_seq.get(decision.node, 0))
        held = self._published.get(decision.node)
        if held is None or held.computed_at <= decision.computed_at:
            self._take_as_published(decision)

    def _take_as_published(self, decision: NodeResourceComputed) -> None:
        """`decision` is the node's last one on the stream: what the next is compared with, and its baseline."""
        self._published[decision.node] = decision
        baseline = last_write_after(decision)
        if baseline is None:
            self._last_written.pop(decision.node, None)
        else:
            self._last_written[decision.node] = baseline

    def _count_problems(self) -> None:
        problems, self.state.problems = self.state.problems, []
        for reason in problems:
            if reason == PROBLEM_CONFIG_ERROR:
                self._metrics.config_errors.inc()
                log.warning("noderesource: %s", self.state.config.error)
            else:
                self._metrics.skipped_inputs.labels(reason=reason).inc()

    def _mark(self, node: str, trigger: Trigger, at: float) -> None:
        dirty = self._dirty.setdefault(node, _Dirty())
        dirty.triggers.add(trigger)
        dirty.time = max(dirty.time, at)

    def _take_dirty(self) -> dict[str, _Dirty]:
        """The nodes to decide now; those of partitions still replaying (`_held`) stay marked."""
        if not self._held:
            dirty, self._dirty = self._dirty, {}
            return dirty
        dirty = {n: d for n, d in self._dirty.items() if self._partition(n) not in self._held}
        self._dirty = {n: d for n, d in self._dirty.items() if n not in dirty}
        return dirty

    # --- deciding and publishing

    async def decide_pending(self) -> None:
        """Decide the nodes marked since the last call (called after each fetched batch)."""
        if not self._ready:
            return
        async with self._lock:
            await self._decide(self._take_dirty())

    async def resync(self) -> None:
        """Decide again, at the clock's time, every node not decided within the last half resync interval (the
        periodic tick; tests call it directly). Nodes whose NodeMetrics keep arriving were just decided, so a tick
        costs only the quiet nodes — the ones it exists for (a NodeMetric gone stale, a write falling due)."""
        if not self._ready:
            return
        async with self._lock:
            now = self._clock()
            recent = now - self.settings.resync_interval_seconds / 2
            for node in self.state.nodes:
                if self._decided_at.get(node, -math.inf) <= recent:
                    self._mark(node, "resync", now)
            await self._decide(self._take_dirty())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_interval_seconds)
            try:
                await self.resync()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("noderesource: resync failed (the next tick retries): %s", e)

    async def _decide(self, dirty: dict[str, _Dirty]) -> None:
        """Decide the `dirty` nodes and publish what changed; a node whose decision the stream refused is decided
        again from the decision that won (up to PUBLISH_ROUNDS), then left marked for the next batch or tick."""
        try:
            for _ in range(PUBLISH_ROUNDS):
                decisions = await self._decisions(dirty)
                refused = await self._publish(decisions, dirty) if decisions else []
                if not refused:
                    return
                self._metrics.refused.inc(len(refused))
                await self._read_back(refused, dirty)
                dirty = {node: dirty[node] for node in refused}
            log.info("noderesource: %d nodes decided elsewhere again and again, decided next batch", len(dirty))
            self._mark_again(dirty)
        finally:
            await self._record_config()
            await self._publish_config_status()

    async def _decisions(self, dirty: dict[str, _Dirty]) -> list[NodeResourceComputed]:
        """The decisions of the `dirty` nodes worth publishing (not a repeat of the last one published)."""
        decisions: list[NodeResourceComputed] = []
        for position, node in enumerate(sorted(dirty)):
            if position and not position % YIELD_EVERY_DECISIONS:
                await asyncio.sleep(0)  # a resync of many nodes must not hold the event loop for seconds
            item = dirty[node]
            if self.store is not None:
                self._note_strategy(node, item.triggers)
            previous = self._published.get(node)
            decision = self.state.decide(
                node,
                now=decision_time(item.time, previous),
                last_written=self._last_written.get(node),
                trigger=item.triggers,
            )
            if decision is None:
                self._forget_if_gone(node, item.triggers)
                continue
            self._decided_at[node] = self._clock()
            self._metrics.recomputations.inc()
            reason = DECISION_REASONS.get(decision.reason, "other")
            self._metrics.decisions.labels(outcome=decision.outcome, reason=reason).inc()
            if is_repeat(previous, decision):
                self._metrics.repeats.inc()
                continue
            decisions.append(decision)
        return decisions

    def _mark_again(self, dirty: dict[str, _Dirty]) -> None:
        for node, item in dirty.items():
            for trigger in item.triggers:
                self._mark(node, trigger, item.time)

    async def _read_back(self, nodes: list[str], dirty: dict[str, _Dirty]) -> None:
        """Take each node's last decision on the stream as the one published (the other replica's, which won)."""
        try:
            for node in nodes:
                stored = await self.bus.last_on_subject(
                    streams.KOORD_NODERESOURCE, subjects.noderesource_computed(node)
                )
                if stored is None:  # aged out since: nothing to build on
                    self._subject_seq[node] = 0
                    continue
                self._subject_seq[node] = stored.stream_seq
                self._take_as_published(NODERESOURCE_COMPUTED_DECODER.decode(stored.data))
        except Exception as e:
            self._mark_again({node: dirty[node] for node in nodes})
            raise TemporaryError(
                f"reading back node resource decisions failed: {e}", delay=PUBLISH_RETRY_DELAY_SECONDS
            ) from e

    # --- recording the config in effect (for the API)

    def _note_strategy(self, node: str, triggers: Iterable[Trigger]) -> None:
        """Recompute the node's effective strategy when it may have changed; remember it if it did."""
        node_object = self.state.nodes.get(node)
        if node_object is None or not self.state.config.available:
            if node_object is None and node in self._node_strategies:
                del self._node_strategies[node]
                self._unrecorded_strategies.add(node)
            return
        if node in self._node_strategies and not STRATEGY_TRIGGERS.intersection(triggers):
            return
        meta = node_object.metadata
        placement = colocation.node_strategy(self.state.config.config, meta.labels, meta.annotations)
        effective = msgspec.structs.replace(placement.strategy, enable=placement.colocation_enabled)
        record = NodeStrategyRecord(
            node=node,
            strategy=colocation.strategy_to_json(effective),
            node_config=placement.node_config_name or "",
            warnings=placement.warnings,
            updated_at=self._clock(),
        )
        held = self._node_strategies.get(node)
        if held is None or (held.strategy, held.node_config, held.warnings) != (
            record.strategy,
            record.node_config,
            record.warnings,
        ):
            self._node_strategies[node] = record
            self._unrecorded_strategies.add(node)

    async def _record_config(self) -> None:
        """Write the config state and changed node strategies to the store; a failure is retried next time."""
        if self.store is None:
            return
        config_state = self.state.config
        try:
            if config_state is not self._recorded_config and config_state != self._recorded_config:
                await self.store.set_config(
                    config=colocation.config_to_json(config_state.config),
                    error=config_state.error,
                    available=config_state.available,
                    at=self._clock(),
                )
                self._recorded_config = config_state
            if self._unrecorded_strategies:
                nodes = sorted(self._unrecorded_strategies)
                await self.store.set_node_strategies(
                    [self._node_strategies[n] for n in nodes if n in self._node_strategies],
                    removed=[n for n in nodes if n not in self._node_strategies],
                )
                self._unrecorded_strategies.difference_update(nodes)
        except Exception as e:
            log.warning("noderesource: recording the colocation config failed (retried after the next batch): %s", e)

    async def _publish_config_status(self) -> None:
        """Publish the ConfigMap's error status when it differs from the last one on the subject (read back once
        after start-up, so a restart republishes nothing and a recovery while down still names the old error), for
        the k8s writer's Kubernetes Event; without a store too. A failure is retried after the next batch or tick."""
        error = self.state.config.error
        try:
            held = self._config_status
            if held is None:
                stored = await self.bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_CONFIG_STATUS)
                held = ColocationConfigStatus(error=None, at=self._clock())  # none stored: nothing to tell
                if stored is not None:
                    with contextlib.suppress(msgspec.DecodeError):  # an unreadable one counts as none
                        held = COLOCATION_CONFIG_STATUS_DECODER.decode(stored.data)
                self._config_status = held
            if held.error == error:
                return
            version = self.state.configmap_version
            status = ColocationConfigStatus(
                error=error, previous_error=held.error, resource_version=version, at=self._clock()
            )
            await self.bus.publish(
                subjects.NODERESOURCE_CONFIG_STATUS,
                msgspec.json.encode(status),
                msg_id=msg_id("noderesource.config-status", error or "", held.error or "", version),
            )
        except Exception as e:
            log.warning("noderesource: publishing the colocation config status failed (retried next batch): %s", e)
            return
        self._config_status = status

    def _forget_if_gone(self, node: str, triggers: Iterable[Trigger]) -> None:
        if node in self.state.nodes:
            return  # known but not decidable: the config is not available yet
        self._published.pop(node, None)
        self._subject_seq.pop(node, None)
        self._last_written.pop(node, None)
        self._decided_at.pop(node, None)
        if "node" not in triggers:  # a pod or NodeMetric of a node never seen (or gone): nothing to decide
            self._metrics.skipped_inputs.labels(reason=SKIP_UNKNOWN_NODE).inc()

    async def _publish(self, decisions: list[NodeResourceComputed], dirty: dict[str, _Dirty]) -> list[str]:
        """Publish `decisions`, each conditional on its subject's last sequence as known here; the nodes refused."""
        messages = []
        for decision in decisions:
            data = msgspec.json.encode(decision)
            digest = hashlib.blake2b(decision_identity(decision), digest_size=16).hexdigest()
            messages.append(
                (
                    subjects.noderesource_computed(decision.node),
                    data,
                    msg_id("noderesource.computed", decision.node, decision.computed_at, digest),
                    self._subject_seq.get(decision.node, 0),
                )
            )
        try:
            acks = await self.bus.publish_many_if_last(messages)
        except Exception as e:  # decide these nodes again with the next batch or tick
            self._mark_again({decision.node: dirty[decision.node] for decision in decisions})
            raise TemporaryError(
                f"publishing node resource decisions failed: {e}", delay=PUBLISH_RETRY_DELAY_SECONDS
            ) from e
        refused: list[str] = []
        for decision, ack in zip(decisions, acks, strict=True):
            if ack is None:
                refused.append(decision.node)
                continue
            self._subject_seq[decision.node] = ack.seq
            self._published[decision.node] = decision
            baseline = last_write_after(decision)
            if baseline is not None:
                self._last_written[decision.node] = baseline
            if not ack.duplicate:
                self._metrics.published.inc()
                if decision.write_due:
                    self._metrics.writes_due.inc()
        return refused
