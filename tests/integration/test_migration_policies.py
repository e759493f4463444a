"""Koordinator's three eviction policies carried out against the fake API server, seen in its request log: the
arbiter and executor (services.migration) on a real nats-server, the bridge's verb responder (services.k8s.verbs)
doing each verb. With args evictionPolicy Delete and defaultDeleteOptions, a job whose pod is labelled
`koordinator.sh/evict-policy: Eviction` is evicted through the Eviction API, an unlabelled one DELETEd with the
default options, a job labelled SoftEviction gets the soft-eviction annotation on its pod (and succeeds once the
test, playing the component that honours it, deletes the pod), and a job with unusable deleteOptions is failed
(FailedEvict) without a request for its pod. ReservationFirst jobs: a reservationRef is used, not made; a
reservationOptions.template is the Reservation made. With nodeFit, a pod that fits no other node is not migrated."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import msgspec
from kubernetes_asyncio.client import ApiClient

from bus.jetstream import JetStreamBus
from schemas import k8s_verbs
from services.common.metrics import new_registry
from services.k8s.verbs import KubeVerbs, VerbResponder
from services.migration.args import MigrationArgs
from services.migration.evictors import LABEL_EVICT_POLICY
from tests.fakes.kube_api import FakeKubeApi, RecordedRequest
from tests.integration.test_migration_bridge import pmj, pod, replica_set
from tests.integration.test_migration_execution import Running, evict_directly, phase, run, sample, stopper
from tests.support.crd import crd_errors, crd_validator
from tests.support.waiting import eventually

__all__ = ["stopper"]  # the fixture, used by name

PODS = "/api/v1/namespaces/default/pods"


def writes(kube_api: FakeKubeApi, name: str) -> list[tuple[str, str, Any]]:
    """The writes sent for pod `name`: (verb, path, body)."""
    return [(b.verb, b.path, b.body) for b in kube_api.bodies if b.path.startswith(f"{PODS}/{name}")]


def status(kube_api: FakeKubeApi, name: str) -> dict[str, Any]:
    return dict((kube_api.get("PodMigrationJob", name) or {}).get("status") or {})


def pmj_with_ref(index: int, reservation: str) -> dict[str, Any]:
    job = pmj(index)
    job["spec"]["reservationOptions"] = {"reservationRef": {"kind": "Reservation", "name": reservation}}
    return job


class _Named(NamedTuple):
    name: str


def _meta(obj: dict[str, Any]) -> _Named:
    return _Named(obj["metadata"]["name"])


def conditions(kube_api: FakeKubeApi, name: str) -> list[dict[str, str]]:
    return [{"type": c["type"], "reason": c.get("reason", "")} for c in status(kube_api, name).get("conditions", [])]


async def test_each_eviction_policy_reaches_the_api_server(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    validator = crd_validator("scheduling.koordinator.sh_podmigrationjobs.yaml")
    kube_api.put("ReplicaSet", replica_set(20))
    for index in range(4):
        p = pod(index)
        p["spec"]["containers"] = [{"name": "c", "image": "web"}]  # a valid pod: the annotation patch is validated
        if index == 0:
            p["metadata"]["labels"] = {LABEL_EVICT_POLICY: "Eviction"}
        kube_api.put("Pod", p)
    jobs = [evict_directly(index) for index in range(4)]
    jobs[0]["spec"]["deleteOptions"] = {"gracePeriodSeconds": 7}
    jobs[2]["metadata"]["labels"] = {LABEL_EVICT_POLICY: "SoftEviction"}
    jobs[2]["metadata"]["annotations"] = {"koordinator.sh/evict-trigger": "LowNodeLoad"}
    jobs[2]["spec"]["deleteOptions"] = {"preconditions": {"uid": "uid-web-2"}}
    jobs[3]["spec"]["deleteOptions"] = {"gracePeriodSeconds": -1}  # the CRD allows it; the executor does not
    for j in jobs:
        assert crd_errors(validator, j) == []
        kube_api.put("PodMigrationJob", j)
    args = MigrationArgs(
        default_job_mode="EvictDirectly",
        eviction_policy="Delete",
        default_delete_options=k8s_verbs.DeleteOptions(grace_period_seconds=0, propagation_policy="Background"),
        max_migrating_per_node=0,
        max_migrating_per_workload="100%",
        max_unavailable_per_workload="100%",
        skip_check_expected_replicas=True,
        object_limiters={},
    )
    running = await run(koordbus_bus, kube_client, args)
    stopper.append(running)

    # Eviction (the pod's label): the Eviction API, with the job's deleteOptions
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    assert RecordedRequest("evict", f"{PODS}/web-0/eviction", "application/json") in kube_api.requests
    [(_, _, eviction)] = writes(kube_api, "web-0")
    assert eviction["kind"] == "Eviction" and eviction["deleteOptions"] == {"gracePeriodSeconds": 7}

    # Delete (the args' policy): a DELETE with the default delete options
    await eventually(lambda: phase(kube_api, "job-1") == "Succeeded", timeout=20)
    assert writes(kube_api, "web-1") == [
        ("delete", f"{PODS}/web-1", {"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
    ]
    assert kube_api.get("Pod", "web-1", "default") is None

    # SoftEviction (the job's label): only the annotation, by merge patch; the pod stays until someone deletes it
    await eventually(lambda: writes(kube_api, "web-2") != [], timeout=20)
    assert RecordedRequest("patch", f"{PODS}/web-2", "application/merge-patch+json") in kube_api.requests
    [(_, _, patch)] = writes(kube_api, "web-2")
    assert list(patch) == ["metadata"] and list(patch["metadata"]) == ["annotations"]
    annotated = kube_api.get("Pod", "web-2", "default") or {}
    spec = json.loads(annotated["metadata"]["annotations"][k8s_verbs.ANNOTATION_SOFT_EVICTION])
    assert spec["deleteOptions"] == {"preconditions": {"uid": "uid-web-2"}}
    assert (spec["initiator"], spec["reason"]) == ("LowNodeLoad", "LowNodeLoad") and spec["timestamp"].endswith("Z")
    await eventually(lambda: {"type": "Eviction", "reason": "Evicting"} in conditions(kube_api, "job-2"), timeout=20)
    assert phase(kube_api, "job-2") == "Running"
    kube_api.remove("Pod", "web-2", "default")  # whatever honours the annotation deletes the pod
    await eventually(lambda: phase(kube_api, "job-2") == "Succeeded", timeout=20)

    # unusable deleteOptions: failed with why, nothing asked for its pod
    await eventually(lambda: phase(kube_api, "job-3") == "Failed", timeout=20)
    failed = status(kube_api, "job-3")
    assert failed["reason"] == "FailedEvict" and "gracePeriodSeconds" in failed["message"]
    assert writes(kube_api, "web-3") == [] and kube_api.get("Pod", "web-3", "default") is not None

    assert sample(running.registry, "koordbus_k8s_writes_total", object="eviction", outcome="evicted") == 3


async def test_a_jobs_reservation_ref_is_used_not_made(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """A ReservationFirst job naming an existing Reservation: the executor creates none, reads the one named, and
    evicts (here by SoftEviction, the args' policy) once the test, playing koord-scheduler, has placed it."""
    kube_api.put("ReplicaSet", replica_set(10))
    web = pod(0)
    web["spec"]["containers"] = [{"name": "c", "image": "web"}]
    kube_api.put("Pod", web)
    spare: dict[str, Any] = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": "spare-0"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "c", "image": "web"}]}},
            "owners": [{"object": {"namespace": "default", "name": "web-0"}}],
        },
    }
    kube_api.put("Reservation", spare)
    job = pmj_with_ref(0, "spare-0")
    assert crd_errors(crd_validator("scheduling.koordinator.sh_podmigrationjobs.yaml"), job) == []
    kube_api.put("PodMigrationJob", job)
    args = MigrationArgs(eviction_policy="SoftEviction", object_limiters={})
    stopper.append(await run(koordbus_bus, kube_client, args))
    reads = "/apis/scheduling.koordinator.sh/v1alpha1/reservations/spare-0"
    await eventually(lambda: any(r.verb == "get" and r.path == reads for r in kube_api.requests), timeout=20)
    placed = kube_api.get("Reservation", "spare-0") or {}
    placed["status"] = {"phase": "Available", "nodeName": "n9"}
    kube_api.put("Reservation", placed)
    await eventually(lambda: writes(kube_api, "web-0") != [], timeout=20)
    assert [verb for verb, _, _ in writes(kube_api, "web-0")] == ["patch"]
    assert [r.name for r in map(_meta, kube_api.objects("Reservation"))] == ["spare-0"]  # none made
    assert not [r for r in kube_api.requests if r.verb == "create" and "/reservations" in r.path]

    def reservation_created() -> list[dict[str, Any]]:
        return [c for c in status(kube_api, "job-0").get("conditions", []) if c["type"] == "ReservationCreated"]

    # the executor evicts first and writes the job's status after: the status may lag the pod's patch
    await eventually(lambda: reservation_created() != [], timeout=20)
    assert reservation_created()[0]["message"] == "uses Reservation spare-0"


async def test_a_jobs_reservation_template_is_the_reservation_made(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """The job's template names the Reservation and sets its allocatePolicy: that is what is created (validated by
    the fake against Koordinator's CRD), read back by that name, and evicted for once placed."""
    kube_api.put("ReplicaSet", replica_set(10))
    kube_api.put("Pod", pod(0))
    job = pmj(0)
    job["spec"]["reservationOptions"] = {
        "template": {"metadata": {"name": "spare-web-0"}, "spec": {"allocatePolicy": "Restricted"}},
        "preemptionOptions": {},
    }
    assert crd_errors(crd_validator("scheduling.koordinator.sh_podmigrationjobs.yaml"), job) == []
    kube_api.put("PodMigrationJob", job)
    stopper.append(await run(koordbus_bus, kube_client, MigrationArgs(object_limiters={})))
    await eventually(lambda: kube_api.get("Reservation", "spare-web-0") is not None, timeout=20)
    made = kube_api.get("Reservation", "spare-web-0") or {}
    assert made["spec"]["allocatePolicy"] == "Restricted" and made["spec"]["allocateOnce"] is True
    assert made["spec"]["ttl"] == "5m" and kube_api.get("Reservation", "job-0") is None
    made["status"] = {"phase": "Available", "nodeName": "n9"}
    kube_api.put("Reservation", made)
    await eventually(lambda: kube_api.get("Pod", "web-0", "default") is None, timeout=20)
    assert [verb for verb, _, _ in writes(kube_api, "web-0")] == ["evict"]


async def test_node_fit_refuses_a_pod_no_other_node_has_room_for(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, stopper: list[Running]
) -> None:
    """nodeFit on, the nodes as the bridge observes them: web-0 (4 cores, on n0) fits n2, web-1 (16 cores) fits
    no node but its own n1 (n0 and n2 have 8 cores), so its job fails (ForbiddenMigratePod, the NodeFit filter)
    and nothing is sent for its pod."""
    kube_api.put("ReplicaSet", replica_set(10))
    for name, cpu in (("n0", "8"), ("n1", "32"), ("n2", "8")):
        kube_api.put("Node", {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "pods": "110"}}})
    for index, cpu in ((0, "4"), (1, "16")):
        p = pod(index)
        p["spec"]["containers"] = [{"name": "c", "image": "web", "resources": {"requests": {"cpu": cpu}}}]
        kube_api.put("Pod", p)
        kube_api.put("PodMigrationJob", evict_directly(index))
    args = MigrationArgs(default_job_mode="EvictDirectly", node_fit=True, object_limiters={})
    stopper.append(await run(koordbus_bus, kube_client, args))
    await eventually(lambda: phase(kube_api, "job-0") == "Succeeded", timeout=20)
    await eventually(lambda: phase(kube_api, "job-1") == "Failed", timeout=20)
    assert status(kube_api, "job-1")["reason"] == "ForbiddenMigratePod"
    assert writes(kube_api, "web-1") == [] and kube_api.get("Pod", "web-1", "default") is not None


async def test_the_responder_carries_out_each_eviction_verb(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    """Called directly: a DELETE whose uid precondition names another pod is a 409 (the pod stays), a DELETE or a
    soft eviction of a missing pod a 404, each counted as an eviction by answer; the annotation patch touches
    nothing but the annotation."""
    for index in (0, 1):
        p = pod(index)
        p["spec"]["containers"] = [{"name": "c", "image": "web"}]
        p["metadata"]["annotations"] = {"keep": "me"}
        kube_api.put("Pod", p)
    registry = new_registry()
    responder = VerbResponder(None, KubeVerbs(kube_client), registry=registry)  # type: ignore[arg-type]

    async def ask(verb: k8s_verbs.Verb) -> k8s_verbs.VerbAnswer:
        return k8s_verbs.ANSWER_DECODER.decode(await responder.answer(msgspec.json.encode(verb)))

    stale = k8s_verbs.DeleteOptions(preconditions=k8s_verbs.Preconditions(uid="uid-someone-else"))
    replaced = await ask(k8s_verbs.DeletePod(namespace="default", name="web-0", delete_options=stale))
    assert replaced.status == 409 and kube_api.get("Pod", "web-0", "default") is not None
    gone = await ask(k8s_verbs.DeletePod(namespace="default", name="ghost"))
    assert gone.status == 404
    soft = k8s_verbs.SoftEvictionSpec(reason="test")
    assert (await ask(k8s_verbs.SoftEvictPod(namespace="default", name="ghost", spec=soft))).status == 404
    assert (await ask(k8s_verbs.SoftEvictPod(namespace="default", name="web-1", spec=soft))).status == 200
    annotations = (kube_api.get("Pod", "web-1", "default") or {})["metadata"]["annotations"]
    assert annotations == {"keep": "me", k8s_verbs.ANNOTATION_SOFT_EVICTION: '{"reason":"test"}'}
    deleted = await ask(k8s_verbs.DeletePod(namespace="default", name="web-0"))
    assert deleted.status == 200 and kube_api.get("Pod", "web-0", "default") is None
    for outcome, count in (("replaced", 1), ("gone", 2), ("evicted", 2)):
        assert sample(registry, "koordbus_k8s_writes_total", object="eviction", outcome=outcome) == count, outcome
