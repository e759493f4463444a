"""The migration arbiter service: requests and the cluster in, one MigrationRound per round out (issue 5, §4.4).

Consumers (durable pull, reset at start: the state lives in memory and is rebuilt every start):
  * events (KOORD_MIGRATION, from the first): MigrationRequested, MigrationRound, MigrationAborted and the
    executor's MigrationPhaseChanged and MigrationCollected folded into services.migration.state.MigrationState;
    the sequence of the last MigrationRound seen is remembered.
  * cluster (KOORD_CLUSTER pods, workloads, nodes and the slo-controller-config ConfigMap, last value per subject,
    then new ones): the ClusterView the rounds read, rebuilt before a round only when something changed; the
    ConfigMap's load-watermarks-config sets the descheduling thresholds and staleness bound when it has them
    (services.common.watermarks), so the descheduler and the load-aware scheduler draw the same line.
  * NodeMetrics (KOORD_NODEMETRIC, last per node), when load-aware descheduling is on.
Load-aware descheduling (`deschedule`, every descheduling interval) is Koordinator's LowNodeLoad Balance round when
the args file has `lowNodeLoadArgs` (services.migration.lownodeload_round; its detectors live here, in memory, and
the last round's decision is `last_low_node_load`, published as a DeschedulerRound on KOORD_DESCHEDULER for the API
and the dashboard, which can also ask for one computed now without acting: `plan`, on koord.v1.rpc.migration.plan),
else the older simplified plan (services.migration.lownodeload); either way each pod it picks becomes one
MigrationRequested named from the pod's uid.
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
import copy
import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Final

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, DeliverPolicy, Delivery, PublishOptions, Responder, msg_id
from bus.errors import BusError, ConflictError
from schemas import kube, migration
from schemas import migration_events as ev
from schemas.cluster import (
    POD_WORKLOAD_OR_NODE_DECODER,
    ConfigMapObserved,
    NodeObserved,
    PodObserved,
    WorkloadObserved,
)
from schemas.descheduler import DeschedulerRound, encode_round
from schemas.node import NodeMetricComputed
from schemas.qos import WatermarksInEffect
from services.common import observe
from services.common.projection import BatchProjector
from services.common.startup import wait_replayed
from services.common.tasks import cancel_and_wait
from services.common.watermark_feed import publish_watermarks
from services.common.watermarks import WATERMARKS_KEY, WatermarkConfig, read_watermarks
from services.migration import arbiter, descheduler_view
from services.migration import lownodeload_round as lnl
from services.migration.args import duration_seconds
from services.migration.lownodeload import NodeLoad, apply_watermarks, plan, stated_watermarks
from services.migration.lownodeload_args import LowNodeLoadArgs
from services.migration.settings import MigrationSettings
from services.migration.state import MigrationState, intake
from services.migration.store import MigrationStore

log = logging.getLogger(__name__)

SERVICE = "migration"
EVENTS_CONSUMER = "migration-events"
CLUSTER_CONSUMER = "migration-cluster"
NODEMETRIC_CONSUMER = "migration-nodemetric"
PROJECTOR_CONSUMER = "migration-projector"
STOP_PROJECTION_SECONDS = 2.0
"""The most a stop waits for the projector to write the rounds appended last (the process has 8 s to stop every
part: nothing here may wait on a bus that has gone)."""
MAX_DECISIONS_PER_MESSAGE = 1000
"""A round's decisions go out in messages of at most this many (a NATS message is 1 MiB by default)."""


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
        self._node_objects: dict[str, kube.Node] = {}
        """node → the Node as observed (Koordinator's LowNodeLoad reads its labels and allocatable)."""
        self.streaks: dict[str, int] = {}
        """node → consecutive overloaded rounds (load-aware descheduling)."""
        self.watermarks: WatermarkConfig = WatermarkConfig()
        self.low_node_load = settings.low_node_load
        """settings.low_node_load with the ConfigMap's load-watermarks-config applied."""
        self.descheduling = settings.low_node_load_args
        """Koordinator's LowNodeLoad as configured (None: the simplified `low_node_load` runs, if enabled)."""
        self.low_node_load_args = (
            lnl.effective_args(self.descheduling, self.watermarks.watermarks) if self.descheduling else None
        )
        """Its args with the ConfigMap's load-watermarks-config applied; kept across rounds, as the plugin's are."""
        self._lnl_lines: tuple[dict[str, float], dict[str, float], int] | None = None
        """The top-level high and low thresholds and expiration last logged."""
        self.detectors = lnl.Detectors()
        """LowNodeLoad's anomaly detectors, in memory: a restart starts every node's count afresh."""
        self.last_low_node_load: lnl.Decision | None = None
        """The last LowNodeLoad round's decision (classes, abnormal nodes, evictions and reasons) for the API."""
        self._stated: WatermarksInEffect | None = None
        self._started = False
        self._plan_responder: Responder | None = None

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
        self._plan_responder = await self.bus.serve(subjects.MIGRATION_RPC_PLAN, self._answer_plan, queue=SERVICE)
        await self.state_watermarks()
        self._ticker = asyncio.create_task(self._loop(), name="migration-arbiter")
        if self.settings.low_node_load.enabled or self.descheduling is not None:
            metrics_spec = self._spec(NODEMETRIC_CONSUMER)
            metrics = self.bus.consume(metrics_spec, _NodeMetricHandler(self), reset=True)
            self._consumers.append(observe.watch_consumer(self._registry, metrics_spec, metrics))
            self._watched_specs.append(metrics_spec)
            self._descheduler = asyncio.create_task(self._deschedule_loop(), name="migration-descheduler")

    async def stop(self) -> None:
        if self._plan_responder is not None:
            await self._plan_responder.stop()
            self._plan_responder = None
        if self._descheduler is not None:
            await cancel_and_wait(self._descheduler)
            self._descheduler = None
        if self._ticker is not None:
            await cancel_and_wait(self._ticker)
            self._ticker = None
        if self._projector is not None:
            # Nothing is decided any more: project the rounds this replica appended last before going, so a clean
            # stop leaves none of them unprojected; bounded, as the bus may be away (the next start projects the
            # rest from the database's offset), and not at all without it.
            if self.bus.connected:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STOP_PROJECTION_SECONDS):
                        await self._projector.wait_idle(STOP_PROJECTION_SECONDS)
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
                    self._node_objects.pop(name, None)
                else:
                    self._nodes[name] = kube.node_allocatable(node)
                    self._node_objects[name] = node
                if self.args.node_fit:
                    self._view = None  # nodeFit reads the nodes
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
        if not self.state.waiting():  # nothing to decide: no view of every pod is built (a pod event drops it)
            return arbiter.Round()
        view = self._view
        if view is None:
            view = self._view = arbiter.ClusterView.build(
                self._pods.values(), self._workloads.values(), self.args, nodes=self._node_objects.values()
            )
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
        if self.descheduling is not None:
            args = lnl.effective_args(self.descheduling, self.watermarks.watermarks)
            lines = (dict(args.pools[0].high or {}), dict(args.pools[0].low or {}), args.expiration_seconds)
            if lines != self._lnl_lines:
                log.info("migration: LowNodeLoad high %s, low %s, expiration %d s", *lines)
                if args.problems:
                    log.warning("migration: LowNodeLoad args refused, no round runs: %s", "; ".join(args.problems))
            self._lnl_lines = lines
            self.low_node_load_args = args

    async def state_watermarks(self) -> None:
        """Publish the descheduling watermarks in effect when they changed (once the cluster replay is done)."""
        if not self._started:
            return
        if self.descheduling is not None:
            stated = lnl.stated_watermarks(self.descheduling, self.watermarks, at=self._clock())
        else:
            stated = stated_watermarks(self.low_node_load, self.watermarks, at=self._clock())
        if self._stated is not None and msgspec.structs.replace(self._stated, at=stated.at) == stated:
            return
        if await publish_watermarks(self.bus, stated):
            self._stated = stated

    async def _deschedule_loop(self) -> None:
        while True:
            interval = self.descheduling.interval_seconds if self.descheduling else None
            await asyncio.sleep(interval or self.settings.low_node_load.interval_seconds)
            try:
                await self.deschedule()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("migration: descheduling round failed (the next one retries): %s", e)

    async def deschedule(self) -> int:
        """One load-aware round: requests for just enough pods of nodes overloaded long enough; returns how many
        were asked for (a pod already asked for is not asked again: its job name comes from its uid)."""
        if self.low_node_load_args is not None:
            return await self._balance(self.low_node_load_args)
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
        asked = 0
        for request in requests:
            asked += await self._request(request.pod, request.reason)
        return asked

    async def _balance(self, args: LowNodeLoadArgs) -> int:
        """Koordinator's Balance round over the service's view; each eviction becomes a MigrationRequested unless
        dryRun (evaluated, logged and kept in last_low_node_load only)."""
        decision = self._low_node_load_round(args, self.detectors, now=self._clock())
        self.last_low_node_load = decision
        if decision.problems:
            log.warning("migration: LowNodeLoad round not run: %s", "; ".join(decision.problems))
        asked = 0
        jobs: dict[str, str] = {}
        for eviction in decision.evictions:
            pod = self._pods.get(eviction.pod)
            if decision.dry_run or pod is None:
                log.info(
                    "migration: LowNodeLoad%s evicts %s: %s",
                    " (dry run)" if decision.dry_run else "",
                    eviction.pod,
                    eviction.reason,
                )
                continue
            asked += await self._request(pod, eviction.reason)
            jobs[eviction.pod] = lnl.job_name(pod)
        await self._publish_round(descheduler_view.round_view(decision, jobs=jobs))
        return asked

    async def _publish_round(self, view: DeschedulerRound) -> None:
        """The round's view for the API and the dashboard; a bus failure loses only this view (logged)."""
        try:
            await self.bus.publish(
                subjects.DESCHEDULER_ROUNDS, encode_round(view), msg_id=msg_id("descheduler.round", view.at)
            )
        except BusError as e:
            log.warning("migration: the descheduler round's view was not published: %s", e)

    def plan_round(self) -> DeschedulerRound:
        """A LowNodeLoad round over the current state with copies of the detectors: what the next round would decide
        now, with nothing asked for and nothing remembered."""
        now = self._clock()
        args = self.low_node_load_args
        if args is None or self.descheduling is None:
            problem = "the args file has no lowNodeLoadArgs: Koordinator's LowNodeLoad is not configured (no plan)"
            return DeschedulerRound(at=now, planned=True, problems=[problem])
        decision = self._low_node_load_round(args, copy.deepcopy(self.detectors), now=now)
        return descheduler_view.round_view(decision, planned=True)

    def _low_node_load_round(self, args: LowNodeLoadArgs, detectors: lnl.Detectors, *, now: float) -> lnl.Decision:
        """One Balance round over what the service holds, with `detectors` (the service's, or a plan's copies)."""
        assert self.descheduling is not None
        return lnl.run_round(
            args,
            nodes=self._node_objects.values(),
            metrics=self.node_metrics,
            pods=self._pods.values(),
            limits=self.descheduling.limits,
            detectors=detectors,
            cache_timeout=self.descheduling.detector_cache_timeout,
            refused=self._have_jobs(),
            now=now,
        )

    async def _answer_plan(self, data: bytes) -> bytes:
        return encode_round(self.plan_round())

    def _have_jobs(self) -> set[str]:
        """The pods (namespace/name) with an active job, or with the job this descheduler asked for."""
        out = set()
        for job in self.state.jobs.values():
            ref = job.spec.pod_ref
            if ref is not None and migration.is_active(job):
                out.add(f"{ref.namespace}/{ref.name}")
        out.update(key for key, pod in self._pods.items() if lnl.job_name(pod) in self.state.jobs)
        return out

    async def _request(self, pod: kube.Pod, reason: str) -> int:
        """Append a descheduler MigrationRequested for the pod (1), or nothing when it was asked for already (0)."""
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        meta = pod.metadata
        name = lnl.job_name(pod)
        if name in self.state.jobs:
            return 0
        job = migration.PodMigrationJob(
            metadata=kube.ObjectMeta(name=name, annotations={"descheduler.koordinator.sh/reason": reason}),
            spec=migration.PodMigrationJobSpec(
                pod_ref=migration.ObjectReference(namespace=meta.namespace, name=meta.name, uid=meta.uid)
            ),
        )
        event = ev.MigrationRequested(job=job, source="descheduler", actor="lownodeload", time=now)
        ack = await self.bus.publish(
            subjects.MIGRATION_REQUESTS, ev.encode_migration_event(event), msg_id=msg_id("migration.request", name)
        )
        return 0 if ack.duplicate else 1
