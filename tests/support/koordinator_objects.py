"""Every Koordinator object the tests use, in one place: what koordbus writes and what clusters hold.

Gathered for tests/deploy/test_crds.py, which checks each is accepted by Koordinator's CRD (so the list holds only
real objects) and by koordbus' generated CRD for its kind. The sources are the ones the other tests validate
against Koordinator's CRDs (tests/support/crd.py): the renderers and mirrors' desired objects (NodeMetric, NodeSLO,
ElasticQuota, ElasticQuotaProfile), the PodMigrationJobs the migration tests put into the fake API server and the
status the executor writes back, the Koordinator objects in ../shared/vectors inputs, and objects as Koordinator's
own components write them, with the fields koordbus does not model (devices, NUMA usage, extensions, preempted
pods …). Add a fixture here when a test builds a new kind of Koordinator object.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from schemas import koordinator, migration, node, quota
from services.common import sloconfig
from services.k8s import nodeslo_mirror, quota_writes, writes
from services.migration import reconcile
from services.nodemetric import core
from services.slo import render as slo_render
from tests.integration.test_migration_bridge import pmj
from tests.integration.test_migration_execution import evict_directly
from tests.support.migration import job
from tests.unit.test_quota_schemas import kubectl_quota
from tests.unit.test_quota_writes import status as quota_status

Json = dict[str, Any]
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
NODEMETRIC, NODESLO = "NodeMetric", "NodeSLO"
ELASTIC_QUOTA, PROFILE, PMJ = "ElasticQuota", "ElasticQuotaProfile", "PodMigrationJob"


# --- NodeMetric


def nodemetric_status(*, span: int) -> node.NodeMetricStatus:
    """A status from the real core over `span` seconds of 1 s samples (0: no data, 100: cold start)."""
    now = 1795317300.0
    samples = [(now - i, 2.5 + (i % 7) / 10, 8 * 2**30 + i) for i in range(span)]
    pods = [
        core.PodSeries("default", "web", [(now - i, 0.25, 512 * 2**20) for i in range(span)], "koord-prod", "LS"),
        core.PodSeries("batch", "job", [(now - i, 1.5, 2**30) for i in range(span)], "koord-batch", "BE"),
    ]
    return core.compute_from_samples(
        report_time=now,
        spec=node.MetricCollectPolicy(durations_seconds=(300, 600)),
        node_samples=samples,
        system_samples=samples[::3],
        pods=pods,
    )


def _resource_map(cpu: str, memory: str) -> Json:
    return {
        "resources": {"cpu": cpu, "memory": memory},
        "devices": [
            {"type": "gpu", "id": "GPU-0", "minor": 0, "health": True, "resources": {"koordinator.sh/gpu": 50}}
        ],
    }


KOORDLET_NODEMETRIC: Json = {
    "apiVersion": koordinator.API_VERSION,
    "kind": NODEMETRIC,
    "metadata": {"name": "node-gpu", "resourceVersion": "1234", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60}},
    "status": {
        "updateTime": "2026-01-01T12:00:00Z",
        "nodeMetric": {
            "nodeUsage": _resource_map("12", "64Gi"),
            "systemUsage": {"resources": {"cpu": "1500m", "memory": "4Gi"}},
            "aggregatedNodeUsages": [{"usage": {"p90": _resource_map("14", "70Gi")}, "duration": "5m0s"}],
            "numaUsages": [{"numaNodeID": 0, "nodeUsage": {"resources": {"cpu": "6"}}}],
        },
        "podsMetric": [
            {
                "namespace": "ml",
                "name": "trainer",
                "podUsage": _resource_map("8", "32Gi"),
                "priority": "koord-batch",
                "qos": "BE",
                "extensions": {"gpu-sharing": {"shares": 2}},
            }
        ],
        "hostApplicationMetric": [{"name": "nginx", "usage": {"resources": {"cpu": "100m"}}, "qos": "LS"}],
        "prodReclaimableMetric": {"resource": {"resources": {"cpu": "2", "memory": "8Gi"}}},
        "prodPeakMetric": {"resource": {"resources": {"cpu": "10", "memory": "48Gi"}}},
    },
}
"""As koordlet writes it on a GPU node: devices, NUMA usage, pod extensions and the prod peak, none of which
koordbus models."""


def nodemetrics() -> Iterator[tuple[str, Json]]:
    policy = node.MetricCollectPolicy()
    for label, span in (("full", 400), ("cold", 100), ("empty", 0)):
        yield f"rendered-{label}", koordinator.nodemetric_object("node-a", policy, nodemetric_status(span=span))
    integers = koordinator.nodemetric_object("node-a", policy, None)
    integers["status"] = koordinator.nodemetric_status_to_json(nodemetric_status(span=400), quantities=False)
    yield "rendered-integers", integers
    yield "spec-only", writes.nodemetric_with_spec("node-b", node.MetricCollectPolicy(durations_seconds=(300,)))
    yield "koordlet", copy.deepcopy(KOORDLET_NODEMETRIC)
    for name, vector in _vectors("batch-resource"):
        if "nodeMetric" in vector["input"]:
            yield (
                f"vector-{name}",
                {"apiVersion": koordinator.API_VERSION, "kind": NODEMETRIC, **vector["input"]["nodeMetric"]},
            )


# --- NodeSLO

SLO_CONFIG: dict[str, str] = {
    "resource-threshold-config": json.dumps(
        {
            "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 60, "cpuEvictTimeWindowSeconds": 30},
            "nodeStrategies": [
                {"name": "gpu", "nodeSelector": {"matchLabels": {"pool": "gpu"}}, "cpuSuppressThresholdPercent": 40}
            ],
        }
    ),
    "resource-qos-config": json.dumps(
        {
            "clusterStrategy": {
                "policies": {"cpuPolicy": "coreSched"},
                "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}, "memoryQOS": {"wmarkRatio": 95}},
                "beClass": {
                    "cpuQOS": {"enable": True, "groupIdentity": -1},
                    "resctrlQOS": {"enable": True, "catRangeEndPercent": 30, "mbaPercent": 50},
                    "blkioQOS": {"blocks": [{"name": "sda", "type": "device", "ioCfg": {"readIOPS": 10}}]},
                    "networkQOS": {"enable": True, "ingressLimit": "100M", "egressRequest": 5000},
                },
                "cgroupRoot": {
                    "blkioQOS": {"blocks": [{"name": "/", "type": "podvolume", "ioCfg": {"ioWeightPercent": 50}}]}
                },
            }
        }
    ),
    "cpu-burst-config": json.dumps({"clusterStrategy": {"policy": "auto", "cfsQuotaBurstPercent": 200}}),
    "system-config": json.dumps(
        {"clusterStrategy": {"minFreeKbytesFactor": 100, "schedFeatures": {"ID_ABSOLUTE_EXPEL": True}}}
    ),
    "host-application-config": json.dumps(
        {
            "applications": [
                {"name": "nginx", "qos": "LS", "cgroupPath": {"base": "CgroupRoot", "relativePath": "nginx/"}}
            ]
        }
    ),
}

KOORDINATOR_NODESLO: Json = {
    "apiVersion": "slo.koordinator.sh/v1alpha1",
    "kind": NODESLO,
    "metadata": {
        "name": "node-x",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-x", "uid": "u"}],
    },
    "spec": {
        "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65},
        "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000},
        "systemStrategy": {"totalNetworkBandwidth": "10G"},
        "hostApplications": [{"name": "sidecar", "qos": "LS", "strategy": {"cpuQOS": {"enable": True}}}],
        "extensions": {"load-aware": {"enable": True, "thresholds": {"cpu": 65}}},
    },
    "status": {},
}
"""As Koordinator's slo-controller writes it, with plugin `extensions` (not modelled by koordbus)."""


def nodeslos() -> Iterator[tuple[str, Json]]:
    yield (
        "defaults",
        nodeslo_mirror.desired_nodeslo("n1", slo_render.render_node_slo(sloconfig.parse_slo_config({}), {}, {})),
    )
    config = sloconfig.parse_slo_config(SLO_CONFIG)
    assert not config.errors, config.errors
    for labels in ({}, {"pool": "gpu"}):
        annotations = {slo_render.ANNOTATION_NETWORK_BANDWIDTH: "25Gi"}
        spec = slo_render.render_node_slo(config, labels, annotations)
        yield f"rendered-{'-'.join(labels.values()) or 'cluster'}", nodeslo_mirror.desired_nodeslo("n2", spec)
    yield "koordinator", copy.deepcopy(KOORDINATOR_NODESLO)


# --- ElasticQuota and ElasticQuotaProfile


def elastic_quotas() -> Iterator[tuple[str, Json]]:
    yield "kubectl", kubectl_quota()
    spec = quota.decode_elastic_quota(kubectl_quota())
    state = quota.QuotaState(name="team-a", runtime={"cpu": 3500}, used={"cpu": 1000, "memory": 2**29})
    yield "rendered-with-state", quota.render_elastic_quota(spec, state)
    yield "rendered-plain", quota.render_elastic_quota(quota.QuotaSpec(name="plain", namespace="ns", max={"cpu": 2000}))
    desired = quota_writes.desired_quota(quota_status())
    assert desired is not None
    yield "mirror-desired", desired
    for name, vector in _vectors("quota-runtime"):
        for index, obj in enumerate(vector["input"]["quotas"]):
            yield f"vector-{name}-{index}", {"apiVersion": quota.API_VERSION, "kind": ELASTIC_QUOTA, **obj}


PROFILE_DOCUMENT: Json = {
    "apiVersion": quota.PROFILE_API_VERSION,
    "kind": PROFILE,
    "metadata": {"name": "gpu-pool", "namespace": "kube-system", "labels": {quota.LABEL_TREE_ID: "123"}},
    "spec": {
        "quotaName": "gpu-root",
        "resourceRatio": "0.9",
        "quotaLabels": {"team": "ml"},
        "nodeSelector": {
            "matchLabels": {"pool": "gpu"},
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}],
        },
    },
}


def profiles() -> Iterator[tuple[str, Json]]:
    yield "kubectl", copy.deepcopy(PROFILE_DOCUMENT)
    yield "rendered", quota.profile_to_json(msgspec.convert(PROFILE_DOCUMENT, quota.ElasticQuotaProfile))
    yield (
        "minimal",
        {
            "apiVersion": quota.PROFILE_API_VERSION,
            "kind": PROFILE,
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {"quotaName": "q", "nodeSelector": {}},
        },
    )


# --- PodMigrationJob


KOORDINATOR_PMJ: Json = {
    "apiVersion": migration.API_VERSION,
    "kind": PMJ,
    "metadata": {"name": "move-web-3", "annotations": {migration.ANNOTATION_PASSED_ARBITRATION: "true"}},
    "spec": {
        "mode": "ReservationFirst",
        "ttl": "5m0s",
        "podRef": {
            "namespace": "default",
            "name": "web-3",
            "uid": "uid-web-3",
            "resourceVersion": "88",
            "fieldPath": "",
        },
        "reservationOptions": {
            "reservationRef": {"name": "move-web-3", "uid": "r-1"},
            "template": {"metadata": {"name": "move-web-3"}, "spec": {"allocateOnce": True}},
            "preemptionOptions": {},
        },
        "deleteOptions": {"gracePeriodSeconds": 30, "preconditions": {"uid": "uid-web-3"}},
    },
    "status": {
        "phase": "Running",
        "status": "PodBoundReservation",
        "nodeName": "n7",
        "podRef": {"namespace": "default", "name": "web-3-new", "uid": "uid-new"},
        "preemptedPodsRef": [{"namespace": "default", "name": "batch-1", "uid": "uid-b1"}],
        "conditions": [
            {"type": "ReservationScheduled", "status": "True", "lastTransitionTime": "2026-01-01T12:00:05Z"}
        ],
    },
}
"""As koord-descheduler's migration controller runs one: a reservation, delete options and preempted pods."""


def _executor_status() -> Json:
    """The status the migration executor writes for a finished eviction (services.migration.executor)."""
    stamp = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.UTC)
    conditions = reconcile.with_condition(
        job("job-0", "web-0", phase="Running", passed=True),
        reconcile.EVICTION,
        "True",
        reconcile.REASON_EVICT_COMPLETE,
        "the pod is gone",
        now=stamp,
    )
    return {
        "phase": "Succeeded",
        "reason": "",
        "message": "Complete",
        "status": "Complete",
        "conditions": json.loads(msgspec.json.encode(conditions)),
    }


def migration_jobs() -> Iterator[tuple[str, Json]]:
    yield "bridge", pmj(1)
    yield "evict-directly", evict_directly(2)
    yield "executor-status", {**evict_directly(0), "status": _executor_status()}
    yield "koordinator", copy.deepcopy(KOORDINATOR_PMJ)
    for name, vector in _vectors("arbitrate"):
        for index, obj in enumerate(vector["input"]["jobs"]):
            yield f"vector-{name}-{index}", {"apiVersion": migration.API_VERSION, "kind": PMJ, **obj}


# --- all of them


def _vectors(kind: str) -> Iterator[tuple[str, Json]]:
    """The inputs of one ../shared/vectors kind (none when ../shared is missing)."""
    for path in sorted((SHARED / "vectors" / kind).glob("*.json")):
        yield path.stem, json.loads(path.read_text())


SOURCES = {
    NODEMETRIC: nodemetrics,
    NODESLO: nodeslos,
    ELASTIC_QUOTA: elastic_quotas,
    PROFILE: profiles,
    PMJ: migration_jobs,
}


def every_object() -> list[tuple[str, str, Json]]:
    """(kind, label, object) for every Koordinator object above."""
    return [(kind, label, obj) for kind, source in SOURCES.items() for label, obj in source()]
