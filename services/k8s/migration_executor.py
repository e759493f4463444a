"""The migration executor: jobs that passed arbitration are carried out against the cluster (spec §4.6).

It lives in the bridge because it needs the cluster's credentials (agents and the arbiter hold none). It folds
KOORD_MIGRATION (services.migration.state.MigrationState; durable reset at start, so the state is rebuilt) and
every `interval` seconds reconciles each passed, unfinished job: it reads the pod from the API server, asks
services.migration.reconcile.next_step what to do and does it: for ReservationFirst jobs it first creates the
job's Reservation and reads it back every pass (koord-scheduler schedules it). Evictions go through the Eviction API (so
PodDisruptionBudgets hold; a 429 is tried again next time, never failed), at no more than evictQPS with bursts of
evictBurst, and no faster per workload (or namespace) than the object limiters allow (§4.7). Each outcome is
published as MigrationPhaseChanged on `koord.v1.migration.execution` (msg id from the job, phase and step, so a
repeated step is stored once). For jobs that came from the cluster the PodMigrationJob's status (phase, reason,
message, conditions) is written back through the status subresource, the arbiter's refusals (Failed,
ForbiddenMigratePod or InvalidPodRef) included. With args.dryRun nothing is evicted: the step is published as a
Succeeded job with reason DryRun. Every minute finished jobs older than their TTL + 5 minutes are garbage-collected
with their Reservations (a failed ReservationFirst job's Reservation goes at once). Built by the composition root.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi
from prometheus_client import CollectorRegistry, Counter

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery, msg_id
from schemas import kube, migration
from schemas import migration_events as ev
from services.common import observe
from services.common.tasks import cancel_and_wait
from services.k8s import instruments, sinks
from services.k8s.eviction_executor import ANSWERS
from services.k8s.sinks import WriteFailedError
from services.migration.args import MigrationArgs, duration_seconds
from services.migration.limiter import EvictionRate, ObjectLimiters
from services.migration.reconcile import (
    EVICTION,
    REASON_EVICTING,
    Step,
    mode_of,
    next_step,
    reservation_for,
    with_condition,
)
from services.migration.state import MigrationState

log = logging.getLogger(__name__)

SERVICE: Final = "k8s-migration-executor"
CONSUMER: Final = "k8s-migration-executor"
HTTP_NOT_FOUND, HTTP_CONFLICT, HTTP_TOO_MANY_REQUESTS = 404, 409, 429
_POD_DECODER: Final = msgspec.json.Decoder(kube.Pod)
PMJ: Final = ("scheduling.koordinator.sh", "v1alpha1", "podmigrationjobs")
RESERVATIONS: Final = ("scheduling.koordinator.sh", "v1alpha1", "reservations")
GC_INTERVAL_SECONDS: Final = 60.0
GC_GRACE_SECONDS: Final = 300.0
GC_WITHOUT_TTL_SECONDS: Final = 1800.0


class _Handler:
    def __init__(self, executor: MigrationExecutor) -> None:
        self._executor = executor

    async def handle(self, delivery: Delivery) -> None:
        self._executor.apply(delivery)

    async def flush(self) -> None:
        return None


class MigrationExecutor:
    def __init__(
        self,
        bus: Bus,
        api: ApiClient,
        args: MigrationArgs,
        *,
        registry: CollectorRegistry,
        interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.args = args
        self.state = MigrationState()
        self.sources: dict[str, str] = {}
        self._core = CoreV1Api(api)
        self._custom = CustomObjectsApi(api)
        self._interval = interval_seconds
        self._clock = clock
        self._rate = EvictionRate(args.evict_qps, args.evict_burst, now=clock())
        self._limiters = ObjectLimiters(args)
        self._replicas: dict[str, int] = {}
        """Job → its workload's expected replicas when it passed (for the object limiter)."""
        self._told: set[str] = set()
        self._collected: set[str] = set()
        """Finished jobs already garbage-collected."""
        """Refused cluster jobs whose Failed status is written."""
        self._consumer: Consumer | None = None
        self._registry = registry
        self._writes = instruments.kube_writes(registry)
        self._task: asyncio.Task[None] | None = None
        self.evictions = Counter(
            "koordbus_migration_evictions", "Eviction requests by answer", ["answer"], registry=registry
        )

    async def start(self) -> None:
        spec = ConsumerSpec(
            durable=CONSUMER, stream=streams.KOORD_MIGRATION, filter_subjects=(subjects.MIGRATION_ALL,), service=SERVICE
        )
        consumer = self.bus.consume(spec, _Handler(self), reset=True)
        self._consumer = observe.watch_consumer(self._registry, spec, consumer)
        self._spec = spec
        self._task = asyncio.create_task(self._loop(), name="migration-executor")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            observe.retire_consumer(self._registry, self._spec)
            self._consumer = None

    async def wait_idle(self, timeout: float) -> bool:
        return self._consumer is None or await self._consumer.wait_idle(timeout)

    def apply(self, delivery: Delivery) -> None:
        event = ev.decode_migration_event(delivery.data)
        if isinstance(event, ev.MigrationRequested):
            self.sources.setdefault(event.job.metadata.name, event.source)
        elif isinstance(event, ev.MigrationRound):
            for decision in event.decisions:
                if decision.outcome == "passed" and decision.replicas:
                    self._replicas[decision.job] = decision.replicas
        self.state.apply(event)

    async def _loop(self) -> None:
        next_gc = 0.0
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.reconcile()
                if self._clock() >= next_gc:
                    next_gc = self._clock() + GC_INTERVAL_SECONDS
                    await self.collect_garbage()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("migration executor: pass failed (the next one retries): %s", e)

    async def reconcile(self) -> int:
        """One pass over the passed, unfinished jobs; returns how many steps were published."""
        published = 0
        for name in sorted(self.state.passed()):
            job = self.state.jobs[name]
            if migration.phase_of(job) in migration.TERMINAL_PHASES:
                continue
            try:
                pod = await self._pod(job)
                reservation = None
                if mode_of(job, self.args) == migration.MODE_RESERVATION_FIRST:
                    reservation = await self._reservation(name)
                step = next_step(
                    job,
                    pod,
                    now=self._clock(),
                    requested_at=self.state.requested_at.get(name, 0.0),
                    args=self.args,
                    reservation=reservation,
                )
                if step is not None and await self._do(job, pod, step):
                    published += 1
            except WriteFailedError as e:
                log.warning("migration executor: job %s: %s (tried again next pass)", name, e)
        await self._tell_refusals()
        return published

    async def collect_garbage(self) -> int:
        """Delete finished PodMigrationJobs (and their Reservations) older than their TTL + 5 minutes (30 minutes
        without a TTL), as Koordinator's controller does every minute; returns how many jobs were deleted."""
        now, deleted = self._clock(), 0
        for name, job in list(self.state.jobs.items()):
            if name in self._collected or migration.phase_of(job) not in migration.TERMINAL_PHASES:
                continue
            ttl = duration_seconds(job.spec.ttl or self.args.default_job_ttl)
            keep = ttl + GC_GRACE_SECONDS if ttl > 0 else GC_WITHOUT_TTL_SECONDS
            if now - self.state.requested_at.get(name, now) < keep:
                continue
            try:
                await self._delete(RESERVATIONS, name)
                if self.sources.get(name) == "cluster":
                    await self._delete(PMJ, name)
                    deleted += 1
            except WriteFailedError as e:
                log.warning("migration executor: collecting job %s: %s (tried again later)", name, e)
                continue
            self._collected.add(name)
        return deleted

    async def _delete(self, kind: tuple[str, str, str], name: str) -> None:
        status, body = await sinks.raw_request(
            self._custom.delete_cluster_custom_object(*kind, name, _preload_content=False)
        )
        if status != HTTP_NOT_FOUND:
            sinks.parsed(status, body, f"delete {kind[2]} {name}")

    async def _tell_refusals(self) -> None:
        """Write Failed onto the PodMigrationJobs the arbiter refused (intake or a non-retryable filter)."""
        for name, job in self.state.jobs.items():
            if name in self._told or self.sources.get(name) != "cluster" or migration.passed_arbitration(job):
                continue
            if migration.phase_of(job) != migration.PHASE_FAILED:
                continue
            step = Step("fail", migration.PHASE_FAILED, job.status.reason, job.status.message)
            try:
                await self._write_status(name, step, list(job.status.conditions))
            except WriteFailedError as e:
                log.warning("migration executor: job %s status: %s (tried again next pass)", name, e)
                continue
            self._told.add(name)

    async def _pod(self, job: migration.PodMigrationJob) -> kube.Pod | None:
        ref = job.spec.pod_ref
        if ref is None:
            return None
        status, body = await sinks.raw_request(
            self._core.read_namespaced_pod(ref.name, ref.namespace, _preload_content=False)
        )
        if status == HTTP_NOT_FOUND:
            return None
        sinks.parsed(status, body, f"get pod {ref.namespace}/{ref.name}")
        return _POD_DECODER.decode(body)

    async def _reservation(self, name: str) -> dict[str, Any] | None:
        status, body = await sinks.raw_request(
            self._custom.get_cluster_custom_object(*RESERVATIONS, name, _preload_content=False)
        )
        return None if status == HTTP_NOT_FOUND else sinks.parsed(status, body, f"get Reservation {name}")

    async def _reserve(self, job: migration.PodMigrationJob, pod: kube.Pod) -> None:
        ttl = job.spec.ttl or self.args.default_job_ttl
        body: Any = reservation_for(job, pod, ttl=ttl)
        status, text = await sinks.raw_request(
            self._custom.create_cluster_custom_object(*RESERVATIONS, body, _preload_content=False)
        )
        if status != HTTP_CONFLICT:  # already made by an earlier pass
            sinks.parsed(status, text, f"create Reservation {job.metadata.name}")

    async def _do(self, job: migration.PodMigrationJob, pod: kube.Pod | None, step: Step) -> bool:
        """Perform `step`; True when a phase change was published."""
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        if step.action == "reserve":
            assert pod is not None
            await self._reserve(job, pod)
        if step.action == "evict":
            assert pod is not None
            if self.args.dry_run:
                step = Step("succeed", migration.PHASE_SUCCEEDED, "DryRun", f"dry run: {kube.pod_key(pod)} not evicted")
            else:
                if self._limiters.exhausted(pod, now=self._clock()):
                    return False  # its workload's (or namespace's) object limiter: a later pass
                if not self._rate.take(now=self._clock()):
                    return False  # evictQPS: the next pass
                answer = await self._evict(pod)
                if answer not in (HTTP_NOT_FOUND, HTTP_TOO_MANY_REQUESTS):
                    self._limiters.evicted(pod, now=self._clock(), replicas=self._replicas.get(job.metadata.name))
                self.evictions.labels(answer=str(answer)).inc()
                self._writes.labels(object=instruments.OBJECT_EVICTION, outcome=ANSWERS.get(answer, "failed")).inc()
                if answer == HTTP_TOO_MANY_REQUESTS:
                    return False  # a disruption budget holds it: tried again later, never failed
                if answer == HTTP_NOT_FOUND:
                    step = Step("fail", migration.PHASE_FAILED, migration.REASON_MISSING_POD, "the pod is gone")
                else:
                    evicted = migration.PodMigrationJob(
                        metadata=job.metadata,
                        spec=job.spec,
                        status=migration.PodMigrationJobStatus(
                            conditions=step.conditions or list(job.status.conditions)
                        ),
                    )
                    conditions = with_condition(evicted, EVICTION, "False", REASON_EVICTING, step.message, now=now)
                    step = Step("evict", migration.PHASE_RUNNING, "", step.message, conditions)
        if step.phase == migration.PHASE_FAILED and mode_of(job, self.args) == migration.MODE_RESERVATION_FIRST:
            await self._delete(RESERVATIONS, job.metadata.name)  # a failed job's reservation holds nothing
        conditions = step.conditions or list(job.status.conditions)
        event = ev.MigrationPhaseChanged(
            job=job.metadata.name,
            phase=step.phase,
            reason=step.reason,
            message=step.message,
            conditions=conditions,
            time=now,
        )
        identity = msg_id("migration.phase", job.metadata.name, step.action, step.phase, step.reason)
        await self.bus.publish(subjects.MIGRATION_EXECUTION, ev.encode_migration_event(event), msg_id=identity)
        self.state.apply(event)
        if self.sources.get(job.metadata.name) == "cluster":
            await self._write_status(job.metadata.name, step, conditions)
        return True

    async def _evict(self, pod: kube.Pod) -> int:
        meta = pod.metadata
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta.name, "namespace": meta.namespace},
        }
        status, text = await sinks.raw_request(
            self._core.create_namespaced_pod_eviction(meta.name, meta.namespace, body, _preload_content=False)
        )
        if status not in (HTTP_NOT_FOUND, HTTP_TOO_MANY_REQUESTS):
            sinks.parsed(status, text, f"evict pod {meta.namespace}/{meta.name}")
        return status

    async def _write_status(self, name: str, step: Step, conditions: list[migration.Condition]) -> None:
        status: dict[str, Any] = {"phase": step.phase, "reason": step.reason, "message": step.message}
        if step.phase == migration.PHASE_SUCCEEDED:
            status["status"] = "Complete"
        status["conditions"] = json.loads(msgspec.json.encode(conditions))
        options: dict[str, Any] = {"_preload_content": False, "_content_type": "application/merge-patch+json"}
        answer, body = await sinks.raw_request(
            self._custom.patch_cluster_custom_object_status(*PMJ, name, {"status": status}, **options)
        )
        if answer != HTTP_NOT_FOUND:  # a job deleted meanwhile has no status to write
            sinks.parsed(answer, body, f"write PodMigrationJob {name} status")
