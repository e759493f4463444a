"""Builders for pod-migration tests: pods with owners, readiness and annotations; PodMigrationJobs; workloads."""

from __future__ import annotations

from typing import Any

import msgspec

from schemas import kube, migration
from schemas.scheduling import SchedulingPod

T0 = "2026-01-01T12:00:00Z"


def pod(
    name: str,
    *,
    namespace: str = "default",
    node: str = "n1",
    owner: str | None = "rs-1",
    owner_kind: str = "ReplicaSet",
    ready: bool = True,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    volumes: list[dict[str, Any]] | None = None,
    created: str = "2026-01-01T10:00:00Z",
    **spec: Any,
) -> kube.Pod:
    owners = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner, "uid": owner, "controller": True}]
    document: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": labels or {},
            "annotations": annotations or {},
            "ownerReferences": owners if owner else [],
            "creationTimestamp": created,
        },
        "spec": {"nodeName": node, "schedulerName": "koord-scheduler", "containers": [{"name": "c"}], **spec},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }
    if priority is not None:
        document["spec"]["priority"] = priority
    if volumes is not None:
        document["spec"]["volumes"] = volumes
    return msgspec.convert(document, SchedulingPod)  # a kube.Pod that keeps nodeSelector, affinity, tolerations


def job(
    name: str,
    pod_name: str,
    *,
    namespace: str = "default",
    phase: str = "",
    passed: bool = False,
    created: str = "2026-01-01T11:59:00Z",
) -> migration.PodMigrationJob:
    document: dict[str, Any] = {
        "metadata": {
            "name": name,
            "creationTimestamp": created,
            "annotations": {migration.ANNOTATION_PASSED_ARBITRATION: "true"} if passed else {},
        },
        "spec": {"podRef": {"namespace": namespace, "name": pod_name, "uid": f"uid-{pod_name}"}},
        "status": {"phase": phase} if phase else {},
    }
    return msgspec.convert(document, migration.PodMigrationJob)


def workload(uid: str = "rs-1", replicas: int = 10, *, namespace: str = "default") -> migration.Workload:
    return migration.Workload(
        api_version="apps/v1", kind="ReplicaSet", namespace=namespace, name=uid, uid=uid, replicas=replicas
    )
