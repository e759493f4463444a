"""agent.actuate: cgroup paths per version and driver, the BE cgroup wants of a node's pods, write ordering and the
per-round bound, and resctrl schemata planning and comparison."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from agent import actuate, core
from agent.slo import effective_slo
from schemas import kube

UID = "3f1e2d3c-0000-4000-8000-000000000001"
CID = "a" * 64
GI = 1 << 30


def be_pod(
    uid: str = UID,
    *,
    annotation: Any = None,
    phase: str = "Running",
    label: str = "BE",
    name: str = "batch-0",
    kube_qos: str = "BestEffort",
) -> actuate.NodePod:
    spec = annotation or {
        "containers": {
            "main": {
                "requests": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"},
                "limits": {"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": "8Gi"},
            }
        }
    }
    pod = msgspec.convert(
        {
            "metadata": {
                "name": name,
                "namespace": "jobs",
                "uid": uid,
                "labels": {"koordinator.sh/qosClass": label},
                "annotations": {
                    "node.koordinator.sh/extended-resource-spec": spec if isinstance(spec, str) else json.dumps(spec)
                },
            },
            "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": phase, "qosClass": kube_qos},
        },
        kube.Pod,
    )
    return actuate.NodePod(pod=pod, containers={"main": ("containerd", CID)})


@pytest.mark.parametrize(
    ("version", "driver", "pod_dir", "container_dir"),
    [
        (1, "cgroupfs", f"p/kubepods/besteffort/pod{UID}", f"p/kubepods/besteffort/pod{UID}/{CID}"),
        (
            2,
            "systemd",
            f"p/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice",
            f"p/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope",
        ),
    ],
)
def test_paths_per_layout(version: int, driver: Any, pod_dir: str, container_dir: str) -> None:
    layout = actuate.Layout(version=version, driver=driver, parent="p")
    assert layout.pod_dir("BestEffort", UID) == pod_dir
    assert layout.container_dir(pod_dir, "containerd", CID) == container_dir
    assert layout.file("cpu", pod_dir, "cpu.shares") == (
        f"cpu/{pod_dir}/cpu.shares" if version == 1 else f"{pod_dir}/cpu.shares"
    )
    guaranteed = actuate.Layout(version=2, driver="systemd").pod_dir("Guaranteed", UID)
    assert guaranteed == f"kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice"


@pytest.mark.parametrize("bad", ["../../etc", "pod", UID + "/..", ""])
def test_malformed_uids_and_container_ids_never_become_paths(bad: str) -> None:
    layout = actuate.Layout(version=1, driver="cgroupfs")
    with pytest.raises(core.AgentNameError):
        layout.pod_dir("BestEffort", bad)
    with pytest.raises(core.AgentNameError):
        layout.container_dir("x", "containerd", bad or "../x")
    with pytest.raises(core.AgentNameError):
        actuate.Layout(version=1, driver="systemd").container_dir("x", "rkt", CID)


def test_be_cgroup_wants_on_v1_pod_before_container_with_reasons() -> None:
    layout = actuate.Layout(version=1, driver="cgroupfs")
    wants, problems = actuate.be_cgroup_wants([be_pod()], layout, effective_slo(None))
    assert problems == []
    pod_dir = f"kubepods/besteffort/pod{UID}"
    values = {w.path: (w.value, w.depth) for w in wants}
    assert values == {
        f"cpu/{pod_dir}/cpu.shares": ("2048", 0),
        f"cpu/{pod_dir}/cpu.cfs_quota_us": ("400000", 0),
        f"memory/{pod_dir}/memory.limit_in_bytes": (str(8 * GI), 0),
        f"cpu/{pod_dir}/{CID}/cpu.shares": ("2048", 1),
        f"cpu/{pod_dir}/{CID}/cpu.cfs_quota_us": ("400000", 1),
        f"memory/{pod_dir}/{CID}/memory.limit_in_bytes": (str(8 * GI), 1),
    }
    assert all("jobs/batch-0" in w.reason for w in wants)


def test_be_cgroup_wants_on_v2_and_with_the_cfs_quota_suppress_policy() -> None:
    layout = actuate.Layout(version=2, driver="cgroupfs")
    slo = effective_slo({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}})
    wants, _ = actuate.be_cgroup_wants([be_pod()], layout, slo)
    pod_dir = f"kubepods/besteffort/pod{UID}"
    values = {w.path: w.value for w in wants if w.depth == 0}
    assert values == {
        f"{pod_dir}/cpu.weight": str(1 + (2048 - 2) * 9999 // 262142),
        f"{pod_dir}/cpu.max": "max",  # suppress with cfsQuota owns BE CPU: the pod's own quota is lifted (§5.7)
        f"{pod_dir}/memory.max": str(8 * GI),
    }


def test_other_pods_and_bad_ones() -> None:
    layout = actuate.Layout(version=1, driver="cgroupfs")
    ls = be_pod("3f1e2d3c-0000-4000-8000-000000000002", label="LS")
    done = be_pod("3f1e2d3c-0000-4000-8000-000000000003", phase="Succeeded")
    broken = be_pod("3f1e2d3c-0000-4000-8000-000000000004", annotation="{not json", name="broken")
    evil = be_pod("../../../etc", name="evil")
    huge = be_pod(
        "3f1e2d3c-0000-4000-8000-000000000005",
        annotation={"containers": {"main": {"limits": {"kubernetes.io/batch-memory": "10Pi"}}}},
        name="huge",
    )
    wants, problems = actuate.be_cgroup_wants([ls, done, broken, evil, huge, be_pod()], layout, effective_slo(None))
    assert {p.target for p in problems} == {"jobs/broken", "jobs/evil", "jobs/huge"}
    assert "is not JSON" in next(p.reason for p in problems if p.target == "jobs/broken")
    assert "outside" in next(p.reason for p in problems if p.target == "jobs/huge")
    assert {w.path.split("/")[3] for w in wants} == {f"pod{UID}"}  # only the good BE pod, nothing partial


def test_a_container_not_running_yet_gets_no_wants() -> None:
    pod = be_pod()
    waiting = actuate.NodePod(pod=pod.pod, containers={})
    wants, _ = actuate.be_cgroup_wants([waiting], actuate.Layout(version=1, driver="cgroupfs"), effective_slo(None))
    assert {w.depth for w in wants} == {0}


def test_plan_orders_shrinking_deepest_first_then_growing_shallowest_first_and_bounds_the_round() -> None:
    def want(path: str, value: str, depth: int) -> actuate.Want:
        return actuate.Want(path=path, value=value, reason="r", depth=depth)

    wants = [
        want("pod/q", "200000", 0),
        want("pod/c/q", "200000", 1),
        want("pod/m", "1000", 0),
        want("pod/c/m", "1000", 1),
        want("pod/s", "2", 0),
        want("gone/s", "2", 0),
    ]
    current = {"pod/q": "100000", "pod/c/q": "-1", "pod/m": "5000", "pod/c/m": "5000", "pod/s": "2"}
    planned = actuate.plan(wants, current, limit=10)
    order = [w.path for w, _ in planned.writes]
    assert order == ["pod/c/q", "pod/c/m", "pod/m", "pod/q"]  # -1 → 200000 shrinks; memory shrinks child first
    assert [w.path for w in planned.missing] == ["gone/s"] and planned.deferred == 0
    bounded = actuate.plan(wants, current, limit=3)
    assert [w.path for w, _ in bounded.writes] == order[:3] and bounded.deferred == 1
    assert actuate.plan(wants, {**current, **{w.path: w.value for w in wants}}, limit=10).writes == []


def test_normalize_reads_kernel_spellings() -> None:
    assert actuate.normalize("x/memory.limit_in_bytes", "9223372036854771712\n") == "-1"
    assert actuate.normalize("x/cpu.max", "max 100000\n") == "max"
    assert actuate.normalize("x/cpu.max", "50000 100000\n") == "50000"
    assert actuate.normalize("x/cpu.shares", "1024\n") == "1024"
    assert actuate.normalize("x/cpu.shares", None) is None


def test_resctrl_schemata_groups_and_comparison() -> None:
    slo = effective_slo(
        {
            "resourceQOSStrategy": {
                "lsClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 100, "mbaPercent": 100}},
                "beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30, "mbaPercent": 55}},
            }
        }
    )
    info = actuate.ResctrlInfo(cbm=0x7FF, cache_ids=(0, 1), mba=True, vendor="GenuineIntel")
    wanted = actuate.resctrl_schemata(slo, info)
    assert wanted["BE"] == {"L3": "L3:0=f;1=f;", "MB": "MB:0=60;1=60;"}
    assert wanted["LS"] == {"L3": "L3:0=7ff;1=7ff;", "MB": "MB:0=100;1=100;"}
    assert wanted["LSR"]["L3"] == "L3:0=7ff;1=7ff;"  # disabled: the "none" values (§5.2)
    kernel = "    L3:0=00f;1=00f\n    MB:0= 60;1= 60\n"
    current = actuate.parse_schemata(kernel)
    assert current == {"L3": {0: 0xF, 1: 0xF}, "MB": {0: 60, 1: 60}}
    assert not actuate.schemata_differs(wanted["BE"]["L3"], current)
    assert not actuate.schemata_differs(wanted["BE"]["MB"], current)
    assert actuate.schemata_differs(wanted["LS"]["L3"], current)
    assert actuate.cache_ids_of("L3:1=7ff;0=7ff\nMB:0=100;1=100\n") == (0, 1)
    no_mba = actuate.resctrl_schemata(slo, actuate.ResctrlInfo(cbm=0x7FF, cache_ids=(0,), mba=False, vendor=""))
    assert set(no_mba["BE"]) == {"L3"}


def test_pods_map_to_resctrl_groups_only_when_their_class_enables_it() -> None:
    slo = effective_slo({"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True}}}})
    assert actuate.group_of(be_pod(), slo) == "BE"
    assert actuate.group_of(be_pod(label="LS"), slo) is None
    assert actuate.group_of(be_pod(label="SYSTEM"), slo) is None
    own = be_pod()
    annotated = msgspec.structs.replace(
        own.pod,
        metadata=msgspec.structs.replace(
            own.pod.metadata, annotations={**own.pod.metadata.annotations, actuate.RESCTRL_POD_ANNOTATION: "{}"}
        ),
    )
    assert actuate.group_of(actuate.NodePod(pod=annotated, containers=own.containers), slo) is None
