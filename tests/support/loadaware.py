"""Builders of pods, nodes and NodeMetric reports for the load-aware extender's tests, in the API's JSON shapes."""

from __future__ import annotations

from typing import Any

import msgspec

from schemas import kube
from schemas.node import (
    AggregatedUsage,
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricInfo,
    NodeMetricStatus,
    PodMetric,
    ResourceMap,
)

GI = 1 << 30


def pod_json(
    name: str,
    *,
    namespace: str = "default",
    cpu: str | None = None,
    memory: str | None = None,
    limit_cpu: str | None = None,
    limit_memory: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner_kind: str | None = None,
    node_name: str = "",
    conditions: list[dict[str, str]] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    limits = {k: v for k, v in (("cpu", limit_cpu), ("memory", limit_memory)) if v is not None}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    if owner_kind:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": "owner", "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "conditions": conditions or []}}


def pod(name: str, **kwargs: Any) -> kube.Pod:
    return msgspec.convert(pod_json(name, **kwargs), kube.Pod)


def node_json(
    name: str,
    *,
    cpu: str = "32",
    memory: str = "128Gi",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}}


def node(name: str, **kwargs: Any) -> kube.Node:
    return msgspec.convert(node_json(name, **kwargs), kube.Node)


def report(
    node_name: str,
    *,
    at: float,
    cpu: int,
    memory: int,
    pods: dict[str, tuple[int, int]] | None = None,
    prod_pods: frozenset[str] = frozenset(),
    aggregated: dict[int, dict[str, tuple[int, int]]] | None = None,
    system: tuple[int, int] = (0, 0),
    report_interval: int = 60,
) -> NodeMetricComputed:
    """A NodeMetric report: node usage (cpu milli, memory bytes), pod usages by namespace/name, aggregated usages
    by duration seconds then type."""
    return NodeMetricComputed(
        node=node_name,
        report_time=at,
        spec=MetricCollectPolicy(report_interval_seconds=report_interval),
        status=NodeMetricStatus(
            update_time=at,
            node_metric=NodeMetricInfo(
                node_usage=_rm(cpu, memory),
                aggregated_node_usages=[
                    AggregatedUsage(duration_seconds=seconds, usage={k: _rm(*v) for k, v in by_type.items()})
                    for seconds, by_type in (aggregated or {}).items()
                ],
                system_usage=_rm(*system) if any(system) else ResourceMap(),
                aggregated_system_usages=[],
            ),
            pods_metric=[
                PodMetric(
                    namespace=key.split("/")[0],
                    name=key.split("/")[1],
                    pod_usage=_rm(*amounts),
                    priority="koord-prod" if key in prod_pods else "koord-batch",
                )
                for key, amounts in (pods or {}).items()
            ],
        ),
    )


def _rm(cpu: int, memory: int) -> ResourceMap:
    return ResourceMap(resources={"cpu": cpu, "memory": memory})
