"""Executing passed jobs against the fake API server (Eviction API, PMJ status through the status subresource,
validated against Koordinator's CRD) with the arbiter and the executor (services.migration) on a real nats-server,
the bridge's verb responder (services.k8s.verbs) carrying out each cluster verb the executor asks for: an
EvictDirectly job evicts its pod and succeeds, a disruption budget's 429 is retried rather than failed, a missing pod
fails the job, evictions keep to evictQPS, a burst of 200 jobs on a 10-replica workload (whose controller the test
plays) never has more than maxUnavailable pods unavailable, and while the bridge does not answer a passed job waits
(counted), never failed, and proceeds once it answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from bus import subjects
from bus.jetstream import JetStreamBus
from schemas import k8s_verbs, migration
from services.common.metrics import new_registry
from services.k8s.observer import ClusterObserver
from services.k8s.settings import K8sSettings
from services.k8s.verbs import KubeVerbs, VerbResponder
from services.migration.args import MigrationArgs, ObjectLimiter
from services.migration.executor import MigrationExecutor
from services.migration.service import MigrationService
from services.migration.settings import MigrationSettings
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_migration_bridge import pmj, pod, replica_set
from tests.support.waiting import eventually

NO_LIMITER = MigrationArgs(default_job_mode="EvictDirectly", object_limiters={})
"""Koordinator's default workload limiter (2 per 5 minutes for 10 replicas) would hold these tests for minutes."""
K8S = K8sSettings(watch_timeout_seconds=30, backoff_initial_seconds=0.05, backoff_max_seconds=0.5)


def evict_directly(index: int) -> dict[str, Any]:
    job = pmj(index)
    job["spec"]["mode"] = "EvictDirectly"
    return job


@dataclass
class Running:
    arbiter: MigrationService
    executor: MigrationExecutor
    observer: ClusterObserver
    verbs: VerbResponder
    registry: CollectorRegistry


async def run(bus: JetStreamBus, client: ApiClient, args: MigrationArgs, *, bridge: bool = True) -> Running:
    """The bridge (observer and, unless `bridge` is False, the verb responder), the arbiter and the executor, the
    way `koordbus up` runs them: one registry."""
    registry = new_registry()
    observer = ClusterObserver(bus, client, K8S, registry=registry)
    await observer.start()
    assert await observer.wait_published(10)
    verbs = VerbResponder(bus, KubeVerbs(client), registry=registry)
    if bridge:
        await verbs.start()
    arbiter = MigrationService(bus, MigrationSettings(args=args, startup_timeout_seconds=10), registry=registry)
    await arbiter.start()
    executor = MigrationExecutor(bus, args, registry=registry, interval_seconds=0.1)
    await executor.start()
    return Running(arbiter, executor, observer, verbs, registry)


@pytest_asyncio.fixture
async def stopper() -> AsyncIterator[list[Running]]:
    running: list[Running] = []
    yield running
    for r in running:
        await r.executor.stop()
        await r.arbiter.stop()
        await r.verbs.stop()
        await r.observer.stop()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def phase(kube_api: FakeKubeApi, name: str) -> str:
    obj = kube_api.get("PodMigrationJob", name) or {}
    return str((obj.get("status") or {}).get("phase", ""))


async def test_an_evict_directly_job_evicts_and_succeeds(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    kube_api.put("ReplicaSet", replica_set(10))
    for index in range(10):
        kube_api.put("Pod", pod(index))
    kube_api.eviction_blocked.add(("default", "web-1"))  # a disruption budget says no, for now
    for index in (0, 1):
        kube_api.put("PodMigrationJob", evict_directly(index))
    missing = evict_directly(7)
    missing["metadata"]["name"] = "job-ghost"
    missing["spec"]["podRef"] = {"namespace": "default", "name": "ghost"}
    kube_api.put("PodMigrationJob", missing)
    running = await run(koordbus_bus, kube_client, NO_LIMITER)
    stopper.append(running)
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    assert kube_api.get("Pod", "web-0", "default") is None
    status = (kube_api.get("PodMigrationJob", "job-0") or {})["status"]
    assert status["status"] == "Complete" and status["conditions"][-1]["reason"] == "EvictComplete"
    await eventually(lambda: phase(kube_api, "job-ghost") == "Failed", timeout=20)
    assert (kube_api.get("PodMigrationJob", "job-ghost") or {})["status"]["reason"] == "MissingPod"
    await asyncio.sleep(0.5)
    assert phase(kube_api, "job-1") == "Running" and kube_api.get("Pod", "web-1", "default") is not None
    # the 429s were asked again pass after pass, counted by both sides, and never failed the job
    assert sample(running.registry, "koordbus_migration_evictions_total", answer="429") >= 2
    assert sample(running.registry, "koordbus_k8s_writes_total", object="eviction", outcome="blocked") >= 2
    kube_api.eviction_blocked.clear()
    await eventually(lambda: phase(kube_api, "job-1") == "Succeeded", timeout=20)
    assert sample(running.registry, "koordbus_k8s_writes_total", object="eviction", outcome="evicted") == 2
    assert sample(running.registry, "koordbus_migration_bridge_unanswered_total", verb="k8s.pod.get") == 0


async def test_evictions_keep_to_evict_qps(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    kube_api.put("ReplicaSet", replica_set(20))
    for index in range(8):
        kube_api.put("Pod", pod(index))
        kube_api.put("PodMigrationJob", evict_directly(index))
    args = MigrationArgs(
        default_job_mode="EvictDirectly",
        evict_qps=2.0,
        evict_burst=1,
        max_migrating_per_node=0,
        max_migrating_per_workload="100%",
        max_unavailable_per_workload="100%",
        skip_check_expected_replicas=True,
        object_limiters={},
    )
    started = time.monotonic()
    stopper.append(await run(koordbus_bus, kube_client, args))

    def evictions() -> int:
        return sum(1 for r in kube_api.requests if r.verb == "evict")

    await eventually(lambda: evictions() == 8, timeout=20)
    elapsed = time.monotonic() - started
    assert elapsed >= (8 - 1) / 2.0 - 0.2  # one at once, then two a second


async def test_a_burst_of_200_jobs_never_exceeds_max_unavailable(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """The test plays the ReplicaSet controller: an evicted pod is replaced at once (in the same API step as the
    eviction) by a new pod that becomes Ready a little later. Sampled all along, pods not Ready plus pods being
    evicted never exceed maxUnavailable (2)."""
    kube_api.put("ReplicaSet", replica_set(10))
    for index in range(10):
        kube_api.put("Pod", pod(index))
    for n in range(200):
        job = evict_directly(n % 10)
        job["metadata"]["name"] = f"burst-{n:03d}"
        kube_api.put("PodMigrationJob", job)
    generation = dict.fromkeys(range(10), 0)

    def replace(evicted: dict[str, Any]) -> None:
        index = int(evicted["metadata"]["name"].removeprefix("web-"))
        generation[index] += 1
        replacement = pod(index)
        replacement["metadata"]["uid"] = f"uid-web-{index}-{generation[index]}"
        replacement["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        kube_api.put("Pod", replacement)

    kube_api.on_evicted = replace
    stopper.append(await run(koordbus_bus, kube_client, NO_LIMITER))
    worst = 0
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        for index in range(10):
            current = kube_api.get("Pod", f"web-{index}", "default")
            if current and current["status"]["conditions"][0]["status"] == "False" and time.monotonic() % 1 < 0.3:
                current["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
                kube_api.put("Pod", current)
        pods = [kube_api.get("Pod", f"web-{i}", "default") for i in range(10)]
        unready = sum(1 for p in pods if p is None or p["status"]["conditions"][0]["status"] != "True")
        worst = max(worst, unready)
        await asyncio.sleep(0.05)
    assert worst <= 2, worst

    def some_succeeded() -> bool:
        return any(phase(kube_api, f"burst-{n:03d}") == "Succeeded" for n in range(200))

    def refusals_written() -> bool:  # a second job for a pod with an active one: refused at intake
        jobs = kube_api.objects("PodMigrationJob")
        return sum(1 for j in jobs if (j.get("status") or {}).get("reason") == migration.REASON_FORBIDDEN) >= 180

    await eventually(some_succeeded, timeout=20)
    await eventually(refusals_written, timeout=30)


async def test_the_workload_object_limiter_spaces_evictions(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """20 replicas: maxMigrating 2 per (here) 4 s with burst 1 — one eviction at once, the next ~2 s later."""
    kube_api.put("ReplicaSet", replica_set(20))
    for index in range(3):
        kube_api.put("Pod", pod(index))
        kube_api.put("PodMigrationJob", evict_directly(index))
    args = MigrationArgs(
        default_job_mode="EvictDirectly",
        max_migrating_per_node=0,
        max_migrating_per_workload=3,
        max_unavailable_per_workload=3,
        skip_check_expected_replicas=True,
        object_limiters={"workload": ObjectLimiter(duration="4s", max_migrating=2)},
    )
    stopper.append(await run(koordbus_bus, kube_client, args))

    def evictions() -> int:
        return sum(1 for r in kube_api.requests if r.verb == "evict")

    await eventually(lambda: evictions() == 1, timeout=20)
    first = time.monotonic()
    await eventually(lambda: evictions() == 2, timeout=20)
    assert time.monotonic() - first >= 1.5  # 2 per 4 s: a token every 2 s


async def test_a_reservation_first_job(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """The test plays koord-scheduler: it schedules the job's Reservation on another node, and once the pod is
    evicted binds a new pod to it. The job goes Running → evicts → Succeeded, its PMJ status saying so."""
    kube_api.put("ReplicaSet", replica_set(10))
    for index in range(10):
        kube_api.put("Pod", pod(index))
    kube_api.put("PodMigrationJob", pmj(0))  # no mode: the default, ReservationFirst
    stopper.append(await run(koordbus_bus, kube_client, MigrationArgs(object_limiters={})))
    await eventually(lambda: kube_api.get("Reservation", "job-0") is not None, timeout=20)
    reservation = kube_api.get("Reservation", "job-0") or {}
    assert reservation["spec"]["owners"][0]["object"]["name"] == "web-0"
    await asyncio.sleep(0.5)
    assert kube_api.get("Pod", "web-0", "default") is not None  # nothing evicted before the reservation is placed
    reservation["status"] = {"phase": "Available", "nodeName": "n9"}
    kube_api.put("Reservation", reservation)
    await eventually(lambda: kube_api.get("Pod", "web-0", "default") is None, timeout=20)
    replacement = pod(0)
    replacement["metadata"]["uid"] = "uid-web-0-new"
    kube_api.put("Pod", replacement)
    reservation = kube_api.get("Reservation", "job-0") or {}
    reservation["status"]["currentOwners"] = [{"namespace": "default", "name": "web-0", "uid": "uid-web-0-new"}]
    kube_api.put("Reservation", reservation)
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    conditions = {
        c["type"]: c["reason"] for c in (kube_api.get("PodMigrationJob", "job-0") or {})["status"]["conditions"]
    }
    assert conditions == {
        "ReservationCreated": "ReservationCreated",
        "ReservationScheduled": "ReservationScheduled",
        "Eviction": "EvictComplete",
        "PodBoundReservation": "ReservationBound",
    }


async def test_finished_jobs_are_collected_after_their_ttl(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    kube_api.put("ReplicaSet", replica_set(10))
    kube_api.put("Pod", pod(0))
    kube_api.put("PodMigrationJob", evict_directly(0))
    running = await run(koordbus_bus, kube_client, NO_LIMITER)
    stopper.append(running)
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    executor = running.executor
    assert await executor.collect_garbage() == 0  # fresh: kept
    later = time.time() + 5 * 60 + 5 * 60 + 1  # past the TTL (5m) + 5 minutes
    executor._clock = lambda: later  # type: ignore[method-assign]
    assert await executor.collect_garbage() == 1
    assert kube_api.get("PodMigrationJob", "job-0") is None
    assert "job-0" not in executor.state.jobs and not executor.sources  # forgotten where it was collected ...
    await eventually(lambda: "job-0" not in running.arbiter.state.jobs, timeout=10)  # ... and, folded, by the arbiter
    assert await executor.collect_garbage() == 0  # once
    # A PodMigrationJob of the same name made again is a new job: arbitrated and carried out afresh.
    executor._clock = time.time  # type: ignore[method-assign]
    kube_api.put("Pod", pod(0))
    kube_api.put("PodMigrationJob", evict_directly(0))
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    assert migration.passed_arbitration(running.arbiter.state.jobs["job-0"])


async def test_dry_run_records_without_evicting(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    kube_api.put("ReplicaSet", replica_set(10))
    kube_api.put("Pod", pod(0))
    kube_api.put("PodMigrationJob", evict_directly(0))
    args = MigrationArgs(default_job_mode="EvictDirectly", object_limiters={}, dry_run=True)
    stopper.append(await run(koordbus_bus, kube_client, args))
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    assert (kube_api.get("PodMigrationJob", "job-0") or {})["status"]["reason"] == "DryRun"
    assert kube_api.get("Pod", "web-0", "default") is not None
    assert not any(r.verb == "evict" for r in kube_api.requests)


async def test_a_job_waits_while_the_bridge_does_not_answer(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """No responder on the verb subject: the passed job is asked about pass after pass (each counted), stays as it
    was — never Failed, its pod untouched — and is carried out once the bridge answers."""
    kube_api.put("ReplicaSet", replica_set(10))
    kube_api.put("Pod", pod(0))
    kube_api.put("PodMigrationJob", evict_directly(0))
    running = await run(koordbus_bus, kube_client, NO_LIMITER, bridge=False)
    stopper.append(running)

    def unanswered() -> float:
        return sample(running.registry, "koordbus_migration_bridge_unanswered_total", verb="k8s.pod.get")

    await eventually(lambda: running.executor.state.passed() == {"job-0"}, timeout=20)
    await eventually(lambda: unanswered() >= 5, timeout=20)
    job = running.executor.state.jobs["job-0"]
    assert migration.phase_of(job) == migration.PHASE_PENDING
    assert phase(kube_api, "job-0") == "" and kube_api.get("Pod", "web-0", "default") is not None
    assert not any(r.verb == "evict" for r in kube_api.requests)
    await running.verbs.start()
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    assert kube_api.get("Pod", "web-0", "default") is None


async def test_a_bridge_that_answers_too_late_is_not_a_failure(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """A responder that never answers in time: each ask times out, is counted, and the job is not failed."""
    kube_api.put("ReplicaSet", replica_set(10))
    kube_api.put("Pod", pod(0))
    kube_api.put("PodMigrationJob", evict_directly(0))
    stuck = asyncio.Event()

    async def never(data: bytes) -> bytes:
        await stuck.wait()
        return b""

    responder = await koordbus_bus.serve(subjects.K8S_RPC_VERB, never, queue="k8s-verbs", concurrency=4)
    running = await run(koordbus_bus, kube_client, NO_LIMITER, bridge=False)
    stopper.append(running)
    running.executor._bridge_timeout = 0.2
    try:
        await eventually(
            lambda: sample(running.registry, "koordbus_migration_bridge_unanswered_total", verb="k8s.pod.get") >= 3,
            timeout=20,
        )
        assert migration.phase_of(running.executor.state.jobs["job-0"]) == migration.PHASE_PENDING
        assert phase(kube_api, "job-0") == ""
    finally:
        stuck.set()
        await responder.stop()


async def test_the_responder_answers_what_the_api_server_said(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    """Called directly: a read's object as sent, a 404 with its message, a 429 counted as blocked, and a request
    that is no verb answered as such (status 0), never raised."""
    kube_api.put("Pod", pod(0))
    kube_api.put("Pod", pod(1))
    kube_api.eviction_blocked.add(("default", "web-1"))
    registry = new_registry()
    responder = VerbResponder(None, KubeVerbs(kube_client), registry=registry)  # type: ignore[arg-type]

    async def ask(verb: k8s_verbs.Verb) -> k8s_verbs.VerbAnswer:
        return k8s_verbs.ANSWER_DECODER.decode(await responder.answer(msgspec.json.encode(verb)))

    read = await ask(k8s_verbs.GetPod(namespace="default", name="web-0"))
    assert read.status == 200 and msgspec.json.decode(read.object)["metadata"]["uid"] == "uid-web-0"
    gone = await ask(k8s_verbs.GetPod(namespace="default", name="ghost"))
    assert gone.status == 404 and gone.error and msgspec.json.decode(gone.object) is None
    blocked = await ask(k8s_verbs.EvictPod(namespace="default", name="web-1"))
    assert blocked.status == 429
    assert sample(registry, "koordbus_k8s_writes_total", object="eviction", outcome="blocked") == 1
    junk = k8s_verbs.ANSWER_DECODER.decode(await responder.answer(b'{"type": "k8s.pod.explode.v1"}'))
    assert junk.status == 0 and "not a cluster verb" in junk.error
