"""The migration executor: jobs that passed arbitration are carried out against the cluster (spec §4.6).

It runs beside the arbiter (built by the composition root where `koordbus service migration` or `koordbus up` runs
it) and decides every step; the Kubernetes bridge, which alone holds the cluster's credentials, carries out each
cluster verb it asks for over request/reply (schemas.k8s_verbs on `koord.v1.rpc.k8s.verb`, answered by
services.k8s.verbs). It folds KOORD_MIGRATION (services.migration.state.MigrationState; durable reset at start, so
the state is rebuilt) and every `interval` seconds reconciles each passed, unfinished job: it reads the pod, asks
services.migration.reconcile.next_step what to do and does it: for ReservationFirst jobs it first creates the job's
Reservation (or uses the one its reservationOptions.reservationRef names) and reads it back every pass
(koord-scheduler schedules it). Evictions follow the job's eviction policy (services.migration.evictors: the
Eviction API by default, so PodDisruptionBudgets hold and a 429 is tried again next time, never failed; or a DELETE,
or the soft-eviction annotation; with the job's or the default delete options, a job whose delete options are
unusable failed with FailedEvict), at no more than evictQPS with bursts of evictBurst, and no faster per workload
(or namespace) than the object limiters allow (§4.7). Each outcome is published as MigrationPhaseChanged on
`koord.v1.migration.execution` (msg id from the job, phase and step, so a repeated step is stored once). For jobs
that came from the cluster the PodMigrationJob's status (phase, reason, message, conditions) is written back through
the status subresource, the arbiter's refusals (Failed, ForbiddenMigratePod or InvalidPodRef) included. With
args.dryRun nothing is evicted: the step is published as a Succeeded job with reason DryRun. Every minute finished
jobs older than their TTL + 5 minutes are garbage-collected with their Reservations (a failed ReservationFirst job's
Reservation goes at once), each with a MigrationCollected appended, on which every fold forgets the job. A verb the
bridge does not answer (nobody serves it, or no answer in time) ends the pass: its step is tried again next pass,
never failed, and counted in `koordbus_migration_bridge_unanswered{verb}`.
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
from prometheus_client import CollectorRegistry, Counter

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery, msg_id
from bus.errors import BusError, BusUnavailableError
from schemas import k8s_verbs as verbs
from schemas import kube, migration
from schemas import migration_events as ev
from services.common import observe
from services.common.tasks import cancel_and_wait
from services.migration import evictors
from services.migration.args import MigrationArgs, duration_seconds
from services.migration.limiter import EvictionRate, ObjectLimiters
from services.migration.reconcile import (
    EVICTION,
    REASON_EVICTING,
    Step,
    mode_of,
    next_step,
    reservation_for,
    reservation_name,
    reservation_problem,
    with_condition,
)
from services.migration.state import MigrationState

log = logging.getLogger(__name__)

SERVICE: Final = "migration"
CONSUMER: Final = "migration-executor"
HTTP_NOT_FOUND, HTTP_CONFLICT, HTTP_TOO_MANY_REQUESTS = 404, 409, 429
_POD_DECODER: Final = msgspec.json.Decoder(kube.Pod)
GC_INTERVAL_SECONDS: Final = 60.0
GC_GRACE_SECONDS: Final = 300.0
GC_WITHOUT_TTL_SECONDS: Final = 1800.0
BRIDGE_TIMEOUT_SECONDS: Final = 40.0
"""How long a verb waits for the bridge's answer: longer than the bridge's own API request timeout
(KOORDBUS_WRITE_TIMEOUT_SECONDS, 30 s by default), so an answer that comes is heard."""


class VerbFailedError(Exception):
    """A cluster verb that did not go through: its step is tried again next pass. `unanswered`: the bridge did not
    answer at all (the rest of the pass waits too)."""

    def __init__(self, message: str, *, unanswered: bool = False) -> None:
        super().__init__(message)
        self.unanswered = unanswered


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
        args: MigrationArgs,
        *,
        registry: CollectorRegistry,
        instance: str = "",
        interval_seconds: float = 1.0,
        bridge_timeout_seconds: float = BRIDGE_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`instance` names the durable consumer as the arbiter's (replicas running at once need distinct names)."""
        self.bus = bus
        self.args = args
        self.state = MigrationState()
        self.sources: dict[str, str] = {}
        self._instance = instance
        self._interval = interval_seconds
        self._bridge_timeout = bridge_timeout_seconds
        self._clock = clock
        self._rate = EvictionRate(args.evict_qps, args.evict_burst, now=clock())
        self._limiters = ObjectLimiters(args)
        self._replicas: dict[str, int] = {}
        """Job → its workload's expected replicas when it passed (for the object limiter)."""
        self._told: set[str] = set()
        """Refused cluster jobs whose Failed status is written."""
        self._collected: set[str] = set()
        """Finished jobs whose cluster objects are deleted, until their MigrationCollected is folded."""
        self._bridge_away = False
        """The last verb went unanswered (said once at WARNING, until the bridge answers again)."""
        self._consumer: Consumer | None = None
        self._registry = registry
        self._task: asyncio.Task[None] | None = None
        self.evictions = Counter(
            "koordbus_migration_evictions", "Eviction requests by answer", ["answer"], registry=registry
        )
        self.unanswered = Counter(
            "koordbus_migration_bridge_unanswered",
            "Cluster verbs the bridge did not answer (nobody serving them, or no answer in time); the step is tried "
            "again next pass",
            ["verb"],
            registry=registry,
        )

    async def start(self) -> None:
        spec = ConsumerSpec(
            durable=f"{CONSUMER}-{self._instance}" if self._instance else CONSUMER,
            stream=streams.KOORD_MIGRATION,
            filter_subjects=(subjects.MIGRATION_ALL,),
            service=SERVICE,
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
        self._fold(ev.decode_migration_event(delivery.data))

    def _fold(self, event: ev.MigrationEvent) -> None:
        if isinstance(event, ev.MigrationRequested):
            self.sources.setdefault(event.job.metadata.name, event.source)
        elif isinstance(event, ev.MigrationRound):
            for decision in event.decisions:
                if decision.outcome == "passed" and decision.replicas:
                    self._replicas[decision.job] = decision.replicas
        self.state.apply(event)
        if isinstance(event, ev.MigrationCollected) and event.job not in self.state.jobs:
            for kept in (self.sources, self._replicas):
                kept.pop(event.job, None)
            self._told.discard(event.job)
            self._collected.discard(event.job)

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
            job = self.state.jobs.get(name)  # the consumer folds while this pass awaits: a job may be gone
            if job is None or migration.phase_of(job) in migration.TERMINAL_PHASES:
                continue
            try:
                pod = await self._pod(job)
                reservation = None
                if mode_of(job, self.args) == migration.MODE_RESERVATION_FIRST:
                    reservation = (
                        await self._reservation(reservation_name(job)) if not reservation_problem(job) else None
                    )
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
            except VerbFailedError as e:
                if e.unanswered:
                    return published  # the bridge is away: the next pass tries again
                log.warning("migration executor: job %s: %s (tried again next pass)", name, e)
        await self._tell_refusals()
        return published

    async def collect_garbage(self) -> int:
        """Delete finished PodMigrationJobs (and their Reservations) older than their TTL + 5 minutes (30 minutes
        without a TTL), as Koordinator's controller does every minute, and tell it (MigrationCollected: every fold,
        this one at once, forgets the job); returns how many PodMigrationJobs were deleted."""
        now, deleted = self._clock(), 0
        for name, job in list(self.state.jobs.items()):
            if migration.phase_of(job) not in migration.TERMINAL_PHASES:
                continue
            ttl = duration_seconds(job.spec.ttl or self.args.default_job_ttl)
            keep = ttl + GC_GRACE_SECONDS if ttl > 0 else GC_WITHOUT_TTL_SECONDS
            if now - self.state.requested_at.get(name, now) < keep:
                continue
            if name not in self._collected:
                try:
                    reserved = reservation_name(job)
                    await self._ask(verbs.DeleteReservation(name=reserved), f"delete reservations {reserved}")
                    if self.sources.get(name) == "cluster":
                        await self._ask(verbs.DeleteMigrationJob(name=name), f"delete podmigrationjobs {name}")
                        deleted += 1
                except VerbFailedError as e:
                    if e.unanswered:
                        break
                    log.warning("migration executor: collecting job %s: %s (tried again later)", name, e)
                    continue
                self._collected.add(name)
            try:
                await self._publish_collected(name, requested_at=self.state.requested_at.get(name, 0.0))
            except BusError as e:
                log.warning("migration executor: telling that job %s was collected: %s (tried again later)", name, e)
                break
        return deleted

    async def _publish_collected(self, name: str, *, requested_at: float) -> None:
        """Append MigrationCollected for a job whose cluster objects are gone, and forget the job here at once."""
        event = ev.MigrationCollected(job=name, time=dt.datetime.fromtimestamp(self._clock(), dt.UTC))
        identity = msg_id("migration.collected", name, requested_at)
        await self.bus.publish(subjects.MIGRATION_EXECUTION, ev.encode_migration_event(event), msg_id=identity)
        self._fold(event)

    async def _tell_refusals(self) -> None:
        """Write Failed onto the PodMigrationJobs the arbiter refused (intake or a non-retryable filter)."""
        for name, job in list(self.state.jobs.items()):  # folds come and go while a status write awaits
            if name in self._told or self.sources.get(name) != "cluster" or migration.passed_arbitration(job):
                continue
            if migration.phase_of(job) != migration.PHASE_FAILED:
                continue
            step = Step("fail", migration.PHASE_FAILED, job.status.reason, job.status.message)
            try:
                await self._write_status(name, step, list(job.status.conditions))
            except VerbFailedError as e:
                if e.unanswered:
                    return
                log.warning("migration executor: job %s status: %s (tried again next pass)", name, e)
                continue
            self._told.add(name)

    async def _ask(
        self, verb: verbs.Verb, what: str, *, accept: tuple[int, ...] = (HTTP_NOT_FOUND,)
    ) -> verbs.VerbAnswer:
        """The bridge's answer to `verb`: a 2xx or a status in `accept`; VerbFailedError otherwise."""
        try:
            data = await self.bus.request(
                subjects.K8S_RPC_VERB, msgspec.json.encode(verb), timeout=self._bridge_timeout
            )
        except BusUnavailableError as e:
            self.unanswered.labels(verb=verbs.verb_name(verb)).inc()
            if not self._bridge_away:
                log.warning("migration executor: %s: the bridge did not answer (%s); passed jobs wait for it", what, e)
            self._bridge_away = True
            raise VerbFailedError(f"{what}: {e}", unanswered=True) from e
        except BusError as e:  # the bridge failed while answering
            raise VerbFailedError(f"{what}: {e}") from e
        if self._bridge_away:
            log.info("migration executor: the bridge answers again")
            self._bridge_away = False
        try:
            answer = verbs.ANSWER_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise VerbFailedError(f"{what}: not an answer: {e}") from e
        if answer.status == 0:
            raise VerbFailedError(f"{what}: {answer.error}")
        if not 200 <= answer.status <= 299 and answer.status not in accept:
            raise VerbFailedError(f"{what}: HTTP {answer.status}: {answer.error}")
        return answer

    async def _pod(self, job: migration.PodMigrationJob) -> kube.Pod | None:
        ref = job.spec.pod_ref
        if ref is None:
            return None
        what = f"get pod {ref.namespace}/{ref.name}"
        answer = await self._ask(verbs.GetPod(namespace=ref.namespace, name=ref.name), what)
        if answer.status == HTTP_NOT_FOUND:
            return None
        return _POD_DECODER.decode(answer.object)

    async def _reservation(self, name: str) -> dict[str, Any] | None:
        answer = await self._ask(verbs.GetReservation(name=name), f"get Reservation {name}")
        if answer.status == HTTP_NOT_FOUND:
            return None
        reservation = json.loads(bytes(answer.object))
        if not isinstance(reservation, dict):
            raise VerbFailedError(f"get Reservation {name}: the answer is not a JSON object")
        return reservation

    async def _reserve(self, job: migration.PodMigrationJob, pod: kube.Pod) -> None:
        ttl = job.spec.ttl or self.args.default_job_ttl
        reservation = verbs.CreateReservation(reservation=reservation_for(job, pod, ttl=ttl))
        # a 409: already made by an earlier pass
        await self._ask(reservation, f"create Reservation {job.metadata.name}", accept=(HTTP_CONFLICT,))

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
                verb = evictors.eviction(job, pod, args=self.args, now=now)
                if isinstance(verb, evictors.Refusal):
                    step = Step("fail", migration.PHASE_FAILED, evictors.REASON_FAILED_EVICT, verb.message)
                    return await self._publish(job, step, now=now)
                if not self._rate.take(now=self._clock()):
                    return False  # evictQPS: the next pass
                answer = await self._evict(verb)
                if answer not in (HTTP_NOT_FOUND, HTTP_TOO_MANY_REQUESTS):
                    self._limiters.evicted(pod, now=self._clock(), replicas=self._replicas.get(job.metadata.name))
                self.evictions.labels(answer=str(answer)).inc()
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
        return await self._publish(job, step, now=now)

    async def _publish(self, job: migration.PodMigrationJob, step: Step, *, now: dt.datetime) -> bool:
        """Publish `step`'s phase change (a failed ReservationFirst job's Reservation deleted first); True."""
        if step.phase == migration.PHASE_FAILED and mode_of(job, self.args) == migration.MODE_RESERVATION_FIRST:
            # a failed job's reservation holds nothing
            name = reservation_name(job)
            await self._ask(verbs.DeleteReservation(name=name), f"delete reservations {name}")
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

    async def _evict(self, verb: verbs.EvictPod | verbs.DeletePod | verbs.SoftEvictPod) -> int:
        """The eviction's status: 2xx, 404 (gone) or 429 (a disruption budget holds it); VerbFailedError else."""
        what = f"{verbs.verb_name(verb)} {verb.namespace}/{verb.name}"
        answer = await self._ask(verb, what, accept=(HTTP_NOT_FOUND, HTTP_TOO_MANY_REQUESTS))
        return answer.status

    async def _write_status(self, name: str, step: Step, conditions: list[migration.Condition]) -> None:
        status: dict[str, Any] = {"phase": step.phase, "reason": step.reason, "message": step.message}
        if step.phase == migration.PHASE_SUCCEEDED:
            status["status"] = "Complete"
        status["conditions"] = json.loads(msgspec.json.encode(conditions))
        # a 404: a job deleted meanwhile has no status to write
        await self._ask(verbs.WriteMigrationJobStatus(name=name, status=status), f"write PodMigrationJob {name} status")
