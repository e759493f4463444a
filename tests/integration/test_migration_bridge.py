"""PodMigrationJobs from the cluster to the arbiter, end to end: the bridge watches a ReplicaSet, its pods and 6 PMJs
on the fake API server (PMJs validated against Koordinator's CRD) and publishes WorkloadObserved, PodObserved and
MigrationRequested; the arbiter service on the same real nats-server passes as many as the workload's limits allow;
deleting a PMJ aborts its job."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes_asyncio.client import ApiClient

from bus.jetstream import JetStreamBus
from schemas import migration
from services.common.metrics import new_registry
from services.k8s.observer import ClusterObserver
from services.k8s.settings import K8sSettings
from services.migration.service import MigrationService
from services.migration.settings import MigrationSettings
from tests.fakes.kube_api import FakeKubeApi
from tests.support.crd import crd_errors, crd_validator
from tests.support.waiting import eventually

SETTINGS = K8sSettings(watch_timeout_seconds=30, backoff_initial_seconds=0.05, backoff_max_seconds=0.5)


def replica_set(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web-abc", "namespace": "default", "uid": "rs-1"},
        "spec": {"replicas": replicas},
    }


def pod(index: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"web-{index}",
            "namespace": "default",
            "uid": f"uid-web-{index}",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs-1", "controller": True}
            ],
        },
        "spec": {"nodeName": f"n{index}", "schedulerName": "koord-scheduler", "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pmj(index: int) -> dict[str, Any]:
    return {
        "apiVersion": migration.API_VERSION,
        "kind": migration.KIND,
        "metadata": {"name": f"job-{index}", "creationTimestamp": "2026-01-01T11:59:00Z"},
        "spec": {"podRef": {"namespace": "default", "name": f"web-{index}", "uid": f"uid-web-{index}"}},
    }


async def test_cluster_jobs_reach_the_arbiter(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    validator = crd_validator("scheduling.koordinator.sh_podmigrationjobs.yaml")
    kube_api.put("ReplicaSet", replica_set(10))
    for index in range(10):
        kube_api.put("Pod", pod(index))
    for index in range(6):
        assert crd_errors(validator, pmj(index)) == []
        kube_api.put("PodMigrationJob", pmj(index))
    observer = ClusterObserver(koordbus_bus, kube_client, SETTINGS, registry=new_registry())
    await observer.start()
    arbiter = MigrationService(koordbus_bus, MigrationSettings(startup_timeout_seconds=10), registry=new_registry())
    try:
        assert await observer.wait_published(10)
        await arbiter.start()
        await eventually(lambda: len(arbiter.state.jobs) == 6 and len(arbiter._workloads) == 1)
        await arbiter.run_round()
        await eventually(lambda: len(arbiter.state.passed()) == 2)  # 10 replicas: maxUnavailable 2
        assert len(arbiter.state.waiting()) == 4
        waiting = sorted(arbiter.state.waiting())[0]
        kube_api.remove("PodMigrationJob", waiting)
        await eventually(lambda: arbiter.state.jobs[waiting].status.phase == "Aborted")
        scaled = copy.deepcopy(replica_set(3))
        kube_api.put("ReplicaSet", scaled)
        await eventually(lambda: arbiter._workloads["rs-1"].replicas == 3)
    finally:
        await arbiter.stop()
        await observer.stop()
