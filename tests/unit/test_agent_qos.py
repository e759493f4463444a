"""The QoS math the agent writes: resctrl L3 masks (the spec's examples), MBA on Intel and AMD, BE cgroup values
on cgroup v1 and v2 from the extended-resource-spec annotation or the containers' batch resources."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from agent import qos
from schemas import kube


@pytest.mark.parametrize(
    ("cbm", "start", "end", "mask"),
    [("7ff", 0, 30, "f"), ("7ff", 0, 100, "7ff"), ("7ff", 10, 50, "3c"), ("3ff", 10, 80, "fe"), ("7ff", 1, 2, "0")],
)
def test_l3_masks(cbm: str, start: float, end: float, mask: str) -> None:
    assert qos.l3_mask(qos.parse_cbm(cbm), start, end) == mask


@pytest.mark.parametrize("bad", ["7fe", "0", "zz", "5"])
def test_a_mask_that_is_not_low_ones_is_refused(bad: str) -> None:
    with pytest.raises(qos.QoSError):
        qos.parse_cbm(bad)


@pytest.mark.parametrize(("start", "end"), [(-1, 50), (50, 50), (60, 40), (0, 101)])
def test_a_bad_range_is_refused(start: float, end: float) -> None:
    with pytest.raises(qos.QoSError, match="not 0 ≤ start < end ≤ 100"):
        qos.l3_mask(0x7FF, start, end)


def test_mba() -> None:
    assert [qos.mba_value(p, "GenuineIntel") for p in (55, 100, 10, 1)] == [60, 100, 10, 10]
    assert [qos.mba_value(p, "AuthenticAMD") for p in (100, 50, 55)] == [2048, 80, 88]
    assert [qos.mba_value(p, "GenuineIntel") for p in (None, 0, -5, 101)] == [None, None, None, None]
    assert qos.schemata_line("MB", [1, 0], 60) == "MB:0=60;1=60;"


def test_cgroup_math() -> None:
    assert [qos.milli_cpu_to_shares(m) for m in (1000, 0, -5, 1, 10**9)] == [1024, 2, 2, 2, 262144]
    assert [qos.milli_cpu_to_quota(m) for m in (500, 5, 0, -1)] == [50000, 1000, -1, -1]
    assert qos.shares_to_weight(1024) == 39 and qos.shares_to_weight(2) == 1 and qos.shares_to_weight(262144) == 10000
    assert qos.weight_to_shares(1) == 2 and qos.weight_to_shares(10000) == 262144
    with pytest.raises(qos.QoSError):
        qos.shares_to_weight(1)


def be_pod(containers: list[dict[str, Any]], **meta: Any) -> kube.Pod:
    labels = meta.pop("labels", {"koordinator.sh/qosClass": "BE"})
    return msgspec.convert(
        {"metadata": {"name": "p", "labels": labels, **meta}, "spec": {"containers": containers}}, kube.Pod
    )


def resources(cpu_req: str | None, cpu_lim: str | None, mem_lim: str | None) -> dict[str, Any]:
    requests = {"kubernetes.io/batch-cpu": cpu_req} if cpu_req else {}
    limits = {k: v for k, v in (("kubernetes.io/batch-cpu", cpu_lim), ("kubernetes.io/batch-memory", mem_lim)) if v}
    return {"requests": requests, "limits": limits}


def test_be_cgroup_v1_pod_and_containers() -> None:
    pod = be_pod(
        [
            {"name": "a", "resources": resources("1000", "2000", "1Gi")},
            {"name": "b", "resources": resources("500", "500", "512Mi")},
        ]
    )
    pod_files, containers = qos.be_cgroup(pod, version=1)
    assert pod_files == {"cpu.shares": 1536, "cpu.cfs_quota_us": 250000, "memory.limit_in_bytes": 1610612736}
    assert containers["b"] == {"cpu.shares": 512, "cpu.cfs_quota_us": 50000, "memory.limit_in_bytes": 536870912}


def test_an_unlimited_container_leaves_the_pod_unlimited_and_v2_names() -> None:
    pod = be_pod(
        [
            {"name": "a", "resources": resources("1000", "2000", "1Gi")},
            {"name": "b", "resources": resources("500", None, None)},
        ]
    )
    pod_files, containers = qos.be_cgroup(pod, version=2, ratio=2.0)
    assert pod_files == {"cpu.weight": 59, "cpu.max": "max", "memory.max": "max"}
    assert containers["a"] == {"cpu.weight": 39, "cpu.max": 100000, "memory.max": 1073741824}  # 200000 / ratio 2
    assert qos.be_cgroup(pod, version=1, cfs_quota=False)[0]["cpu.cfs_quota_us"] == -1


def test_the_annotation_wins_and_other_pods_get_nothing() -> None:
    spec = {
        "containers": {
            "main": {
                "requests": {"kubernetes.io/batch-cpu": "2000"},
                "limits": {"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": "4Gi"},
            }
        }
    }
    pod = be_pod([{"name": "main"}], annotations={qos.EXTENDED_RESOURCE_SPEC: json.dumps(spec)})
    pod_files, containers = qos.be_cgroup(pod, version=1)
    assert pod_files["cpu.shares"] == 2048 and pod_files["cpu.cfs_quota_us"] == 400000 and set(containers) == {"main"}
    assert qos.be_cgroup(be_pod([{"name": "c"}], labels={"koordinator.sh/qosClass": "LS"}), version=1) == ({}, {})
    broken = be_pod([{"name": "main"}], annotations={qos.EXTENDED_RESOURCE_SPEC: "{not json"})
    with pytest.raises(qos.QoSError, match="is not JSON"):
        qos.be_cgroup(broken, version=1)
