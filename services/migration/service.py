"""The migration arbiter service: requests and the cluster in, one MigrationRound per round out (issue 5, §4.4).

Consumers (durable pull, reset at start: the state lives in memory and is rebuilt every start):
  * events (KOORD_MIGRATION, from the first): MigrationRequested, MigrationRound and MigrationAborted folded into
    services.migration.state.MigrationState; the sequence of the last MigrationRound seen is remembered.
  * cluster (KOORD_CLUSTER pods, workloads, nodes and the slo-controller-config ConfigMap, last value per subject,
    then new ones): the ClusterView the rounds read, rebuilt before a round only when something changed; the
    ConfigMap's load-watermarks-config sets the descheduling thresholds and staleness bound when it has them
    (services.slo.watermarks), so the descheduler and the load-aware scheduler draw the same line.
Every `interval` (args.arbitrationArgs.interval, default 500 ms) a round runs — once the state has caught up with
the last round this service appended, so a round never decides from a state that lacks its own previous decisions:
new requests go through the intake pre-checks (refused ones are decided "rejected"), the waiting jobs through the
arbitration (services.migration.arbiter), and what is worth telling is appended as MigrationRound with
`Nats-Expected-Last-Subject-Sequence` on the arbiter subject (large rounds in chunks, each guarded the same way).
Two replicas deciding the same round cannot both store it: the loser's append is refused, it catches up and its
next round starts from the winner's decisions. So a job is never passed twice, across restarts and replicas.
Called by the CLI and the integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, DeliverPolicy, Delivery, PublishOptions, msg_id
from bus.errors import ConflictError
from schemas import kube, migration
from schemas import migration_events as ev
from schemas.cluster import (
    POD_WORKLOAD_OR_NODE_DECODER,
    ConfigMapObserved,
    NodeObserved,
    PodObserved,
    WorkloadObserved,
)
from schemas.node import NodeMetricComputed
from schemas.qos import WatermarksInEffect
from services.common import observe
from services.common.projection import BatchProjector
from services.common.startup import wait_replayed
from services.common.tasks import cancel_and_wait
from services.migration import arbiter
from services.migration.args import MigrationArgs, duration_seconds
from services.migration.lownodeload import LowNodeLoadArgs, NodeLoad, apply_watermarks, plan, stated_watermarks
from services.migration.state import MigrationState, intake
from services.migration.store import MigrationStore
from services.slo.core import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE
from services.slo.reader import publish_watermarks
from services.slo.watermarks import WATERMARKS_KEY, WatermarkConfig, read_watermarks

log = logging.getLogger(__name__)

SERVICE = "migration"
EVENTS_CONSUMER = "migration-events"
CLUSTER_CONSUMER = "migration-cluster"
NODEMETRIC_CONSUMER = "migration-nodemetric"
PROJECTOR_CONSUMER = "migration-projector"
MAX_DECISIONS_PER_MESSAGE = 1000
"""A round's decisions go out in messages of at most this many (a NATS message is 1 MiB by default)."""


@dataclass(frozen=True, kw_only=True)
class MigrationSettings:
    args: MigrationArgs = field(default_factory=MigrationArgs)
    """MigrationControllerArgs (Koordinator's names; a file of them via the CLI)."""
    instance: str = ""
    """Names this replica's consumers; replicas running at once need distinct names."""
    startup_timeout_seconds: float = 60.0
    low_node_load: LowNodeLoadArgs = field(default_factory=LowNodeLoadArgs)
    """Load-aware descheduling (off unless enabled): its thresholds, debounce and interval."""
    configmap_namespace: str = CONFIGMAP_NAMESPACE
    configmap_name: str = CONFIGMAP_NAME
    """The slo-controller-config ConfigMap whose load-watermarks-config overrides low_node_load's thresholds and
    staleness bound (the ones the load-aware scheduler filters with)."""
    catch_up_timeout_seconds: float = 5.0
    """How long a round waits for the state to contain this service's previous round before it gives up (and
    tries again next interval)."""


class _Instruments:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.rounds = Counter("koordbus_migration_rounds", "Arbitration rounds run", registry=registry)
        self.decisions = Counter(
            "koordbus_migration_decisions", "Decisions appended, by outcome", ["outcome"], registry=registry
        )
        self.decision_reasons = Counter(
            "koordbus_migration_decision_reasons",
            "Decisions appended, by outcome and why: the filter that held or failed the job (MaxMigratingPerNode, "
            "DaemonSet …), Koordinator's reason for a rejection (ForbiddenMigratePod, InvalidPodRef), none for a pass",
            ["outcome", "reason"],
            registry=registry,
        )
        self.conflicts = Counter(
            "koordbus_migration_round_conflicts",
            "Rounds not stored because another arbiter appended first",
            registry=registry,
        )
        self.waiting = Gauge("koordbus_migration_waiting_jobs", "Jobs waiting for arbitration", registry=registry)


class _EventsHandler:
    def __init__(self, owner: MigrationService) -> None:
        self._owner = owner

    async def handle(self, delivery: Delivery) -> None:
        self._owner.apply_event(delivery)

    async def flush(self) -> None:
        return None


class _NodeMetricHandler:
    def __init__(self, owner: MigrationService) -> None:
        self._owner = owner

    async def handle(self, delivery: Delivery) -> None:
        metric = _NODEMETRIC_DECODER.decode(delivery.data)
        self._owner.node_metrics[metric.node] = metric

    async def flush(self) -> None:
        return None


_NODEMETRIC_DECODER: Final = msgspec.json.Decoder(NodeMetricComputed)


class _ClusterHandler:
    def __init__(self, owner: MigrationService) -> None:
        self._owner = owner

    async def handle(self, delivery: Delivery) -> None:
        self._owner.apply_cluster(delivery.data)

    async def flush(self) -> None:
        await self._owner.state_watermarks()


class MigrationService:
    def __init__(
        self,
        bus: Bus,
        settings: MigrationSettings,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        store: MigrationStore | None = None,
    ) -> None:
        """`store` None: no projection (tests that only look at the stream)."""
        self.bus = bus
        self.store = store
        self.settings = settings
        self.args = settings.args
        self.state = MigrationState()
        self.arbiter_seq = 0
        """The stream sequence of the last MigrationRound folded into the state."""
        self._appended_seq = 0
        """The sequence of the last MigrationRound this service appended."""
        self._pods: dict[str, kube.Pod] = {}
        self._workloads: dict[str, migration.Workload] = {}
        """workload uid → workload."""
        self._workload_keys: dict[str, str] = {}
        """namespace/name → uid (tombstones carry no uid)."""
        self._view: arbiter.ClusterView | None = None
        self._clock = clock
        self._metrics = _Instruments(registry)
        self._metrics.waiting.set_function(lambda: len(self.state.waiting()))
        self._registry = registry
        self._consumers: list[Consumer] = []
        self._projector: Consumer | None = None
        self._watched_specs: list[ConsumerSpec] = []
        """Consumers exported under their spec (observe.watch_consumer), retired at stop."""
        self._ticker: asyncio.Task[None] | None = None
        self._descheduler: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()
        self.node_metrics: dict[str, NodeMetricComputed] = {}
        self._nodes: dict[str, dict[str, int]] = {}
        """node → allocatable."""
        self.streaks: dict[str, int] = {}
        """node → consecutive overloaded rounds (load-aware descheduling)."""
        self.watermarks: WatermarkConfig = WatermarkConfig()
        self.low_node_load = settings.low_node_load
        """settings.low_node_load with the ConfigMap's load-watermarks-config applied."""
        self._stated: WatermarksInEffect | None = None
        self._started = False

    # --- lifecycle

    async def start(self) -> None:
        timeout = self.settings.startup_timeout_seconds
        if (store := self.store) is not None:
            projected = await store.offset(PROJECTOR_CONSUMER)
            spec = ConsumerSpec(
                durable=self._durable(PROJECTOR_CONSUMER),
                stream=streams.KOORD_MIGRATION,
                filter_subjects=(subjects.MIGRATION_ALL,),
                service=SERVICE,
                deliver_policy="by_start_sequence",
                opt_start_seq=projected + 1,
                retry_flush_in_place=True,  # the store skips sequences below its offset
            )
            projector = BatchProjector(
                "migration",
                lambda d: (d.stream_seq, ev.decode_migration_event(d.data)),
                lambda batch: store.apply_events(batch, consumer=PROJECTOR_CONSUMER, stream=streams.KOORD_MIGRATION),
            )
            consumer = self.bus.consume(spec, projector, reset=True)
            self._projector = observe.watch_consumer(self._registry, spec, consumer)
            self._watched_specs.append(spec)
        for name, handler in ((EVENTS_CONSUMER, _EventsHandler(self)), (CLUSTER_CONSUMER, _ClusterHandler(self))):
            consumer = self.bus.consume(self._spec(name), handler, reset=True)
            self._consumers.append(consumer)
            if not await wait_replayed(consumer, what=f"migration: {name}", stall_seconds=timeout):
                log.warning("migration: %s replay stalled for %.0f s; starting with what was read", name, timeout)
        observe.watch_consumers(
            self._registry,
            service=SERVICE,
            consumers={EVENTS_CONSUMER: self._consumers[0], CLUSTER_CONSUMER: self._consumers[1]},
        )
        self._started = True
        await self.state_watermarks()
        self._ticker = asyncio.create_task(self._loop(), name="migration-arbiter")
        if self.settings.low_node_load.enabled:
            metrics_spec = self._spec(NODEMETRIC_CONSUMER)
            metrics = self.bus.consume(metrics_spec, _NodeMetricHandler(self), reset=True)
            self._consumers.append(observe.watch_consumer(self._registry, metrics_spec, metrics))
            self._watched_specs.append(metrics_spec)
            self._descheduler = asyncio.create_task(self._deschedule_loop(), name="migration-descheduler")

    async def stop(self) -> None:
        if self._descheduler is not None:
            await cancel_and_wait(self._descheduler)
            self._descheduler = None
        if self._ticker is not None:
            await cancel_and_wait(self._ticker)
            self._ticker = None
        if self._projector is not None:
            await self._projector.stop()
            self._projector = None
        for consumer in self._consumers:
            await consumer.stop()
        if self._consumers:
            observe.retire_consumers(self._registry, service=SERVICE, names=(EVENTS_CONSUMER, CLUSTER_CONSUMER))
        self._consumers = []
        for spec in self._watched_specs:
            observe.retire_consumer(self._registry, spec)
        self._watched_specs = []

    def _spec(self, durable: str) -> ConsumerSpec:
        policy: DeliverPolicy
        filters: tuple[str, ...]
        if durable == EVENTS_CONSUMER:
            stream, filters, policy = streams.KOORD_MIGRATION, (subjects.MIGRATION_ALL,), "all"
        elif durable == NODEMETRIC_CONSUMER:
            stream, filters, policy = streams.KOORD_NODEMETRIC, (subjects.NODEMETRIC_COMPUTED_ALL,), "last_per_subject"
        else:
            stream, filters, policy = (
                streams.KOORD_CLUSTER,
                (
                    subjects.CLUSTER_PODS,
                    subjects.CLUSTER_WORKLOADS,
                    subjects.CLUSTER_NODES,
                    subjects.cluster_configmap(self.settings.configmap_namespace, self.settings.configmap_name),
                ),
                "last_per_subject",
            )
        return ConsumerSpec(
            durable=self._durable(durable),
            stream=stream,
            filter_subjects=filters,
            service=SERVICE,
            deliver_policy=policy,
        )

    def _durable(self, name: str) -> str:
        return f"{name}-{self.settings.instance}" if self.settings.instance else name

    @property
    def consumers(self) -> list[Consumer]:
        return [*self._consumers, *([self._projector] if self._projector is not None else [])]

    async def _loop(self) -> None:
        interval = duration_seconds(self.args.arbitration_args.interval) or 0.5
        while True:
            await asyncio.sleep(interval)
            if not self.args.arbitration_args.enabled:
                continue
            try:
                await self.run_round()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("migration: round failed (the next one retries): %s", e)

    # --- inputs

    def apply_event(self, delivery: Delivery) -> None:
        event = ev.decode_migration_event(delivery.data)
        self.state.apply(event)
        if delivery.subject == subjects.MIGRATION_ARBITER:
            self.arbiter_seq = max(self.arbiter_seq, delivery.stream_seq)
        self._progress.set()

    def apply_cluster(self, data: bytes) -> None:
        match POD_WORKLOAD_OR_NODE_DECODER.decode(data):
            case ConfigMapObserved(deleted=deleted, data=configmap):
                self.apply_configmap(None if deleted else configmap)
                return
            case NodeObserved(name=name, node=node, deleted=deleted):
                if deleted or node is None:
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = kube.node_allocatable(node)
                return
            case PodObserved(namespace=namespace, name=name, pod=pod, deleted=deleted):
                key = f"{namespace}/{name}"
                if deleted or pod is None:
                    self._pods.pop(key, None)
                else:
                    self._pods[key] = pod
            case WorkloadObserved() as seen:
                key = f"{seen.namespace}/{seen.name}"
                old = self._workload_keys.pop(key, None)
                if old is not None:
                    self._workloads.pop(old, None)
                if not seen.deleted and seen.uid:
                    self._workload_keys[key] = seen.uid
                    self._workloads[seen.uid] = migration.Workload(
                        api_version=seen.api_version,
                        kind=seen.kind,
                        namespace=seen.namespace,
                        name=seen.name,
                        uid=seen.uid,
                        replicas=seen.replicas,
                    )
        self._view = None

    # --- rounds

    async def _caught_up(self) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.catch_up_timeout_seconds
        while self.arbiter_seq < self._appended_seq:
            self._progress.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)
        return True

    async def run_round(self) -> arbiter.Round | None:
        """One round (the loop's; tests call it directly). None when the state is not caught up yet."""
        if not await self._caught_up():
            log.warning("migration: the state has not caught up with this arbiter's last round; skipping a round")
            return None
        self._metrics.rounds.inc()
        view = self._view
        if view is None:
            view = self._view = arbiter.ClusterView.build(self._pods.values(), self._workloads.values(), self.args)
        decisions: list[ev.JobDecision] = []
        new = self.state.new_jobs()
        # New requests are taken in the order they arrived, each against the jobs taken before it.
        fresh = set(new)
        held = [job for name, job in self.state.jobs.items() if name not in fresh]
        rejected: set[str] = set()
        for name in new:
            job = self.state.jobs[name]
            refused = intake(job, view.pod_of(job), held, self.args)
            if refused is None:
                held.append(job)
                continue
            rejected.add(name)
            decisions.append(ev.JobDecision(job=name, outcome="rejected", reason=refused[0], message=refused[1]))
        jobs = [job for name, job in self.state.jobs.items() if name not in rejected]
        result = arbiter.arbitrate(jobs, view, self.args)
        decisions += self.state.to_tell(result)
        if decisions:
            await self._append([self._placed(d, view) for d in decisions])
        return result

    def _placed(self, decision: ev.JobDecision, view: arbiter.ClusterView) -> ev.JobDecision:
        """The decision with where the job's pod was (its node and controller) for the API's filters."""
        job = self.state.jobs.get(decision.job)
        pod = view.pod_of(job) if job is not None else None
        if pod is None:
            return decision
        owner = view.owners.get(kube.pod_key(pod))
        workload = view.workloads.get(owner.uid) if owner is not None else None
        return msgspec.structs.replace(
            decision,
            node=pod.spec.node_name,
            workload=owner.uid if owner is not None else "",
            replicas=workload.replicas if workload is not None else 0,
        )

    async def _append(self, decisions: list[ev.JobDecision]) -> None:
        number = self.state.round + 1
        expected = self.arbiter_seq
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        for start in range(0, len(decisions), MAX_DECISIONS_PER_MESSAGE):
            chunk = decisions[start : start + MAX_DECISIONS_PER_MESSAGE]
            event = ev.MigrationRound(round=number, decisions=chunk, time=now)
            data = ev.encode_migration_event(event)
            digest = hashlib.blake2b(msgspec.json.encode(chunk), digest_size=16).hexdigest()
            try:
                ack = await self.bus.publish(
                    subjects.MIGRATION_ARBITER,
                    data,
                    msg_id=msg_id("migration.round", number, start, digest),
                    options=PublishOptions(expected_last_subject_seq=expected),
                )
            except ConflictError:
                self._metrics.conflicts.inc()
                log.info("migration: round %d not stored: another arbiter appended first", number)
                return
            expected = self._appended_seq = ack.seq
            for decision in chunk:
                self._metrics.decisions.labels(outcome=decision.outcome).inc()
                why = decision.filter or decision.reason or "none"
                self._metrics.decision_reasons.labels(outcome=decision.outcome, reason=why).inc()

    # --- load-aware descheduling

    def apply_configmap(self, data: dict[str, str] | None) -> None:
        """The slo-controller-config's data (None: deleted): the descheduling thresholds and staleness bound."""
        self.watermarks = read_watermarks(data, self.watermarks)
        if error := self.watermarks.errors.get(WATERMARKS_KEY):
            log.warning("migration: %s in error, keeping its last good value: %s", WATERMARKS_KEY, error)
        effective = apply_watermarks(self.settings.low_node_load, self.watermarks.watermarks)
        if effective != self.low_node_load:
            log.info(
                "migration: descheduling thresholds now high %s, low %s, stale after %.0f s",
                effective.high_thresholds,
                effective.low_thresholds,
                effective.stale_after_seconds,
            )
        self.low_node_load = effective

    async def state_watermarks(self) -> None:
        """Publish the descheduling watermarks in effect when they changed (once the cluster replay is done)."""
        if not self._started:
            return
        stated = stated_watermarks(self.low_node_load, self.watermarks, at=self._clock())
        if self._stated is not None and msgspec.structs.replace(self._stated, at=stated.at) == stated:
            return
        if await publish_watermarks(self.bus, stated):
            self._stated = stated

    async def _deschedule_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.low_node_load.interval_seconds)
            try:
                await self.deschedule()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("migration: descheduling round failed (the next one retries): %s", e)

    async def deschedule(self) -> int:
        """One load-aware round: requests for just enough pods of nodes overloaded long enough; returns how many
        were asked for (a pod already asked for is not asked again: its job name comes from its uid)."""
        by_node: dict[str, list[kube.Pod]] = {}
        for pod in self._pods.values():
            if pod.spec.node_name:
                by_node.setdefault(pod.spec.node_name, []).append(pod)
        loads: dict[str, NodeLoad] = {}
        for node, metric in self.node_metrics.items():
            allocatable = self._nodes.get(node)
            if allocatable is None:
                continue
            usage_of = {(m.namespace, m.name): m.pod_usage.resources for m in metric.status.pods_metric}
            pods = [(p, usage_of.get((p.metadata.namespace, p.metadata.name), {})) for p in by_node.get(node, [])]
            loads[node] = NodeLoad(
                allocatable=allocatable,
                usage=metric.status.node_metric.node_usage.resources,
                updated=metric.status.update_time,
                pods=pods,
            )
        self.streaks, requests = plan(loads, self.streaks, self.low_node_load, self.args, now=self._clock())
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        asked = 0
        for request in requests:
            meta = request.pod.metadata
            name = (
                "lownodeload-"
                + hashlib.blake2b(f"{meta.namespace}/{meta.name}/{meta.uid}".encode(), digest_size=8).hexdigest()
            )
            if name in self.state.jobs:
                continue
            job = migration.PodMigrationJob(
                metadata=kube.ObjectMeta(name=name, annotations={"descheduler.koordinator.sh/reason": request.reason}),
                spec=migration.PodMigrationJobSpec(
                    pod_ref=migration.ObjectReference(namespace=meta.namespace, name=meta.name, uid=meta.uid)
                ),
            )
            event = ev.MigrationRequested(job=job, source="descheduler", actor="lownodeload", time=now)
            ack = await self.bus.publish(
                subjects.MIGRATION_REQUESTS, ev.encode_migration_event(event), msg_id=msg_id("migration.request", name)
            )
            asked += 0 if ack.duplicate else 1
        return asked
