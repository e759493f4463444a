"""The agent's QoS loops (agent/loops/runner.py) on generated cgroup v1/v2 and resctrl trees, and on this machine's real
cgroup v1 filesystem: BE cgroups written and read back, idempotent rounds, dry-run, bad input skipped per object,
paths confined to the root, resctrl schemata and tasks, the fail-safe, and the last good NodeSLO across a restart
with the bus away."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

import agent.loops.runner
from agent import actuate, suppress
from agent.core import PodSample, Tick
from agent.loops.runner import QosLoops
from agent.pods import PodList
from agent.settings import AgentSettings, QosSettings
from bus import streams, subjects
from bus.api import Delivery
from bus.errors import BusUnavailableError
from bus.memory import MemoryBus
from schemas import koordinator, kube
from schemas.node import PodRef
from schemas.noderesource import NodeResourceComputed
from schemas.psi import PsiSample
from schemas.qos import ACTUATION_DECODER, ActuationApplied, NodeSloRendered
from tests.support.waiting import eventually
from tests.unit.test_agent_actuate import CID, GI, UID, be_pod

NODE = "node-a"
T0 = 1_700_000_000.0
UNLIMITED_V1 = "9223372036854771712"


class StaticPods:
    def __init__(self, *pods: actuate.NodePod) -> None:
        self.pods = list(pods)
        self.fail = False
        self.lists = 0

    async def list(self) -> PodList:
        self.lists += 1
        if self.fail:
            raise OSError("kubelet refused the connection")
        return PodList(pods=list(self.pods), unreadable=0)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class AwayBus:
    """A bus that is down: every read and publish fails as an unreachable NATS does."""

    async def last_on_subject(self, stream: str, subject: str, *, direct: bool = False) -> Delivery | None:
        raise BusUnavailableError("nats: no servers available")

    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> object:
        raise BusUnavailableError("nats: no servers available")


def v1_tree(root: Path, *, parent: str = "", pod_dirs: bool = True) -> dict[str, Path]:
    """A kubelet-like cgroup v1 cgroupfs tree with one BE pod and its container, kernel defaults in the files."""
    pod = f"kubepods/besteffort/pod{UID}"
    files: dict[str, Path] = {}
    for hierarchy, defaults in (
        ("cpu", {"cpu.shares": "1024", "cpu.cfs_quota_us": "-1"}),
        ("memory", {"memory.limit_in_bytes": UNLIMITED_V1}),
        ("cpuacct", {}),
    ):
        for directory in ("kubepods/besteffort", *((pod, f"{pod}/{CID}") if pod_dirs else ())):
            path = root / hierarchy / parent / directory
            path.mkdir(parents=True, exist_ok=True)
            for name, value in defaults.items():
                (path / name).write_text(value + "\n")
                files[f"{hierarchy}/{directory}/{name}"] = path / name
    return files


def v2_tree(root: Path) -> dict[str, Path]:
    slice_uid = UID.replace("-", "_")
    pod = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{slice_uid}.slice"
    files: dict[str, Path] = {}
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for directory in ("kubepods.slice/kubepods-besteffort.slice", pod, f"{pod}/cri-containerd-{CID}.scope"):
        path = root / directory
        path.mkdir(parents=True, exist_ok=True)
        for name, value in (("cpu.weight", "100"), ("cpu.max", "max 100000"), ("memory.max", "max")):
            (path / name).write_text(value + "\n")
            files[f"{directory}/{name}"] = path / name
    return files


async def slo_bus(spec: Mapping[str, Any] | None = None) -> MemoryBus:
    bus = MemoryBus()
    await bus.ensure_streams([streams.slo_stream(), streams.node_stream()])
    if spec is not None:
        await put_slo(bus, spec)
    return bus


async def put_slo(bus: MemoryBus, spec: Mapping[str, Any]) -> None:
    value = NodeSloRendered(node=NODE, spec=dict(spec), rendered_at=T0)
    await bus.publish(subjects.slo_key(NODE), msgspec.json.encode(value), msg_id=str(uuid.uuid4()))


def loops(
    tmp_path: Path,
    bus: Any,
    pods: StaticPods,
    *,
    cgroup_root: Path,
    mode: str = "apply",
    clock: Clock | None = None,
    **settings: Any,
) -> QosLoops:
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {settings.pop('vendor', 'GenuineIntel')}\n")
    agent_settings = AgentSettings(
        node_name=NODE,
        proc_root=str(proc),
        cgroup_root=str(cgroup_root),
        cgroup_driver=settings.pop("driver", "cgroupfs"),
        kubepods_parent=settings.pop("parent", ""),
    )
    qos_settings = QosSettings(
        qos_mode=mode,  # type: ignore[arg-type]
        state_dir=str(tmp_path / "state"),
        resctrl_root=str(settings.pop("resctrl_root", tmp_path / "no-resctrl")),
        sys_root=str(settings.pop("sys_root", "/sys")),
        pods_poll_interval=settings.pop("pods_poll_interval", 0.0),  # tests change the pods between rounds
        **settings,
    )
    return QosLoops(agent_settings, qos_settings, bus, pods=pods, clock=clock or Clock(), cpu_count=8)


def values(files: Mapping[str, Path]) -> dict[str, str]:
    return {rel: path.read_text().strip() for rel, path in files.items()}


async def published(bus: MemoryBus) -> list[ActuationApplied]:
    stored = await bus.read_recent(
        streams.KOORD_NODE, subjects.stored(subjects.node_actuation(NODE)), since=0, limit=1000
    )
    return [ACTUATION_DECODER.decode(d.data) for d in stored]


async def test_be_cgroups_on_v1_are_written_once_and_reported(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg")
    (event,) = await qos_loops.round()
    pod = f"kubepods/besteffort/pod{UID}"
    after = values(files)
    for directory in (pod, f"{pod}/{CID}"):
        assert after[f"cpu/{directory}/cpu.shares"] == "2048"
        assert after[f"cpu/{directory}/cpu.cfs_quota_us"] == "400000"
        assert after[f"memory/{directory}/memory.limit_in_bytes"] == str(8 * GI)
    assert after["cpu/kubepods/besteffort/cpu.shares"] == "1024"  # the QoS dir is not a BE pod's
    assert event.loop == "be-cgroup" and not event.dry_run and len(event.changes) == 6 and event.problems == []
    first = event.changes[0]
    assert (first.before, first.after) in {("1024", "2048"), ("-1", "400000"), ("-1", str(8 * GI))}
    assert event.slo_revision == 1
    # The next round finds everything in place: no write, no event.
    assert await qos_loops.round() == []
    assert qos_loops.stats.writes == 6
    assert [e.loop for e in await published(bus)] == ["be-cgroup"]


async def test_be_cgroups_on_v2_systemd(tmp_path: Path) -> None:
    files = v2_tree(tmp_path / "cg")
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg", driver="systemd")
    (event,) = await qos_loops.round()
    assert values(files)["kubepods.slice/kubepods-besteffort.slice/cpu.weight"] == "100"  # the QoS slice: untouched
    written = {k: v for k, v in values(files).items() if "-pod" in k}
    assert sorted(set(written.values())) == sorted({"79", "400000", str(8 * GI)})
    assert len(event.changes) == 6


async def test_dry_run_writes_nothing_and_publishes_the_plan_once(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    before = values(files)
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg", mode="dry-run")
    (event,) = await qos_loops.round()
    assert event.dry_run and len(event.changes) == 6
    assert values(files) == before
    assert await qos_loops.round() == []  # the same plan is not published again
    assert qos_loops.stats.writes == 0


async def _publish_ratio(bus: MemoryBus, ratio: str, seq: int) -> None:
    """The noderesource service's decision for the node, carrying the CPU normalization ratio it writes on the Node."""
    decision = NodeResourceComputed(
        node=NODE,
        computed_at=T0 + seq,
        trigger=("topology",),
        outcome="computed",
        resources={},
        annotations={koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO: ratio},
        write_due=False,
        meta_due=True,
        write_reason="up to date",
    )
    await bus.publish(subjects.noderesource_computed(NODE), msgspec.json.encode(decision), msg_id=f"decision-{seq}")


async def test_be_cfs_quota_is_divided_by_the_nodes_cpu_normalization_ratio(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    clock = Clock()
    bus = await slo_bus({})
    await bus.ensure_streams([streams.noderesource_stream()])
    await _publish_ratio(bus, "1.60", 1)
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg", clock=clock)
    await qos_loops.round()
    pod = f"kubepods/besteffort/pod{UID}"
    for directory in (pod, f"{pod}/{CID}"):  # a 4-core batch-cpu limit on CPUs 1.6 times a standard core (§5.7)
        assert values(files)[f"cpu/{directory}/cpu.cfs_quota_us"] == "250000"
        assert values(files)[f"cpu/{directory}/cpu.shares"] == "2048"  # shares are not normalized
    await _publish_ratio(bus, "1.00", 2)  # normalization turned off: the quota goes back at the next NodeSLO poll
    clock.now += 6
    await qos_loops.round()
    assert values(files)[f"cpu/{pod}/cpu.cfs_quota_us"] == "400000"


async def test_bad_input_is_skipped_per_object_and_nothing_partial_is_written(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    # a file that cannot be read (a directory in its place); the real kernel's refusals are in the cgroup v1 test
    refused = files[f"cpu/kubepods/besteffort/pod{UID}/{CID}/cpu.shares"]
    refused.unlink()
    refused.mkdir()
    broken = be_pod("3f1e2d3c-0000-4000-8000-000000000009", annotation="{oops", name="broken")
    missing = be_pod("3f1e2d3c-0000-4000-8000-00000000000a", name="not-started")
    evil = be_pod("../../../../tmp", name="evil")
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(broken, missing, evil, be_pod()), cgroup_root=tmp_path / "cg")
    (event,) = await qos_loops.round()
    reasons = {p.target.rsplit("/", 1)[-1] if "/" in p.target else p.target: p.reason for p in event.problems}
    assert "is not JSON" in reasons["broken"]
    assert "pod uid" in reasons["evil"]
    assert any("missing" in p.reason and "3f1e2d3c-0000-4000-8000-00000000000a" in p.target for p in event.problems)
    assert any("cannot read" in p.reason and p.target.endswith(f"{CID}/cpu.shares") for p in event.problems)
    assert len(event.changes) == 5  # the good pod's other files


async def test_a_symlink_out_of_the_root_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.shares").write_text("1024\n")
    root = tmp_path / "cg"
    v1_tree(root, pod_dirs=False)
    (root / "cpu/kubepods/besteffort" / f"pod{UID}").symlink_to(outside)
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=root)
    await qos_loops.round()
    assert (outside / "cpu.shares").read_text() == "1024\n"


async def test_the_round_bound_defers_the_rest_to_the_next_round(tmp_path: Path) -> None:
    v1_tree(tmp_path / "cg")
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg", max_writes_per_round=4)
    (first,) = await qos_loops.round()
    assert (len(first.changes), first.deferred) == (4, 2)
    (second,) = await qos_loops.round()
    assert (len(second.changes), second.deferred) == (2, 0)


def resctrl_tree(root: Path) -> Path:
    (root / "info/L3").mkdir(parents=True)
    (root / "info/MB").mkdir(parents=True)
    (root / "info/L3/cbm_mask").write_text("7ff\n")
    (root / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
    (root / "tasks").write_text("")
    return root


async def test_resctrl_groups_get_their_schemata_once_and_pod_threads_join_them(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    v1_tree(cg)
    (cg / f"cpu/kubepods/besteffort/pod{UID}/{CID}/tasks").write_text("101\n102\n")
    resctrl = resctrl_tree(tmp_path / "resctrl")
    for group in ("LSR", "LS", "BE"):  # what the kernel does on mkdir: a group with full masks and no tasks
        (resctrl / group).mkdir()
        (resctrl / group / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
        (resctrl / group / "tasks").write_text("101\n" if group == "BE" else "")
    spec = {
        "resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30, "mbaPercent": 50}}}
    }
    bus = await slo_bus(spec)
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=cg, resctrl_root=resctrl, mode="apply")
    events = {e.loop: e for e in await qos_loops.round()}
    changes = {c.path: c for c in events["resctrl"].changes}
    assert set(changes) == {"BE/schemata", "BE/tasks"}  # LS and LSR keep their full masks: nothing to write
    # A regular file takes the last write only; the kernel would merge the two lines. Both were written:
    assert (resctrl / "BE/schemata").read_text() == "L3:0=f;1=f;\nMB:0=50;1=50;\n"  # one write, both lines
    assert changes["BE/schemata"].before == "L3:0=7ff;1=7ff;MB:0=100;1=100"
    assert changes["BE/schemata"].after == "L3:0=f;1=f; MB:0=50;1=50;"
    assert (resctrl / "BE/tasks").read_text() == "101\n102"  # appended: only the thread not there yet
    assert changes["BE/tasks"].after == "+1 threads"
    assert await qos_loops.round() == []  # everything in place: nothing written, nothing published


async def test_resctrl_enabled_without_resctrl_is_one_problem_not_a_crash(tmp_path: Path) -> None:
    v1_tree(tmp_path / "cg")
    spec = {"resourceQOSStrategy": {"lsClass": {"resctrlQOS": {"enable": True}}}}
    bus = await slo_bus(spec)
    qos_loops = loops(tmp_path, bus, StaticPods(), cgroup_root=tmp_path / "cg")
    (event,) = await qos_loops.round()
    assert event.loop == "resctrl" and "resctrl not usable" in event.problems[0].reason
    assert await qos_loops.round() == []


async def test_failsafe_pins_be_cpu_when_the_control_plane_is_silent_and_releases_it(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    quota = "cpu/kubepods/besteffort/cpu.cfs_quota_us"
    clock = Clock()
    away = AwayBus()
    qos_loops = loops(tmp_path, away, StaticPods(), cgroup_root=tmp_path / "cg", clock=clock, failsafe_after=60)
    await qos_loops.round()
    assert values(files)[quota] == "-1"  # silent for 0 s
    clock.now += 61
    await qos_loops.round()
    assert values(files)[quota] == "2000" and qos_loops.failsafe_active
    # The control plane answers again: the quota is released.
    bus = await slo_bus({"resourceUsedThresholdWithBE": {"cpuSuppressMinPercent": 10}})
    qos_loops._bus = bus  # the same agent, reconnected
    qos_loops.slo._reader = bus
    clock.now += 10
    events = await qos_loops.round()
    assert values(files)[quota] == "-1" and not qos_loops.failsafe_active
    assert [e.loop for e in events] == ["failsafe"] and "fail-safe over" in events[0].changes[0].reason


@pytest.mark.cgroup
async def test_the_failsafe_pins_besteffort_on_real_cgroup_v1_lifting_the_pods_quotas_first(tmp_path: Path) -> None:
    """cgroup v1 refuses (EINVAL) a parent's CFS quota below a child's and a child's above its parent's: the BE pods'
    own quotas are lifted before the besteffort quota is pinned, and come back only after it is released."""
    root = _writable_v1_root()
    if root is None:
        pytest.skip("needs a writable cgroup v1 filesystem (cpu, cpuacct, memory) at /sys/fs/cgroup")
    parent = f"koordbus-test-{uuid.uuid4().hex[:12]}"
    pod = f"kubepods/besteffort/pod{UID}"
    tops = [root / h / parent for h in ("cpu", "cpuacct", "memory")]
    try:
        try:
            for hierarchy in ("cpu", "cpuacct", "memory"):
                (root / hierarchy / parent / pod / CID).mkdir(parents=True)
        except OSError as e:
            pytest.skip(f"the kernel refuses new cgroups under {root}: {e}")
        cpu = root / "cpu" / parent

        def quotas() -> tuple[str, str, str]:
            return tuple(  # type: ignore[return-value]
                (cpu / d / "cpu.cfs_quota_us").read_text().strip() for d in ("kubepods/besteffort", pod, f"{pod}/{CID}")
            )

        clock = Clock()
        bus = await slo_bus({})
        qos_loops = loops(
            tmp_path, bus, StaticPods(be_pod()), cgroup_root=root, parent=parent, clock=clock, failsafe_after=60
        )
        (event,) = await qos_loops.round()
        assert event.problems == [] and quotas() == ("-1", "400000", "400000")
        qos_loops.slo._reader = AwayBus()  # the control plane goes silent
        qos_loops._bus = AwayBus()
        clock.now += 61
        events = {e.loop: e for e in await qos_loops.round()}
        assert all(e.problems == [] for e in events.values()), events
        assert quotas() == ("2000", "-1", "-1") and qos_loops.failsafe_active
        qos_loops.slo._reader = bus  # back
        qos_loops._bus = bus
        clock.now += 10
        events = {e.loop: e for e in await qos_loops.round()}
        assert all(e.problems == [] for e in events.values()), events
        assert quotas() == ("-1", "-1", "-1") and not qos_loops.failsafe_active
        clock.now += 1
        events = {e.loop: e for e in await qos_loops.round()}
        assert all(e.problems == [] for e in events.values()), events
        assert quotas() == ("-1", "400000", "400000")
    finally:
        _rmdirs(tops)


async def test_a_restart_with_the_bus_away_keeps_the_last_good_nodeslo(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    spec = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
    bus = await slo_bus(spec)
    first = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg")
    await first.round()
    pod_quota = f"cpu/kubepods/besteffort/pod{UID}/cpu.cfs_quota_us"
    assert values(files)[pod_quota] == "-1"  # suppress by cfsQuota: the BE pod's own quota stays lifted
    files[pod_quota].write_text("400000\n")  # someone (the kubelet) resets it while the agent is down
    restarted = loops(tmp_path, AwayBus(), StaticPods(be_pod()), cgroup_root=tmp_path / "cg")
    assert restarted.slo.revision == 1 and restarted.slo.spec == spec
    await restarted.round()
    assert values(files)[pod_quota] == "-1"  # applied from the saved NodeSLO, not the defaults (400000)
    assert restarted.stats.publish_failures >= 1  # the events could not go out; the write happened


async def test_a_kubelet_that_fails_leaves_node_loops_running(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    pods = StaticPods(be_pod())
    pods.fail = True
    clock = Clock()
    qos_loops = loops(tmp_path, AwayBus(), pods, cgroup_root=tmp_path / "cg", clock=clock, failsafe_after=60)
    assert await qos_loops.round() == []  # nothing to do yet, and no pod is touched without the pod list
    assert qos_loops.stats.pod_list_failures == 1 and qos_loops.stats.rounds == 1
    assert values(files)[f"cpu/kubepods/besteffort/pod{UID}/cpu.shares"] == "1024"
    clock.now += 61  # the control plane silent too: the fail-safe still pins BE CPU
    await qos_loops.round()
    assert qos_loops.failsafe_active and values(files)["cpu/kubepods/besteffort/cpu.cfs_quota_us"] == "2000"


async def test_the_pod_list_is_read_once_per_poll_interval_and_again_right_after_a_failure(tmp_path: Path) -> None:
    v1_tree(tmp_path / "cg")
    pods = StaticPods(be_pod())
    clock = Clock()
    qos_loops = loops(tmp_path, AwayBus(), pods, cgroup_root=tmp_path / "cg", clock=clock, pods_poll_interval=5)
    for _ in range(5):  # rounds within the interval use the list read first
        await qos_loops.round()
        clock.now += 1
    assert pods.lists == 1
    pods.fail = True
    await qos_loops.round()
    assert (pods.lists, qos_loops.stats.pod_list_failures) == (2, 1)
    clock.now += 1
    pods.fail = False
    await qos_loops.round()  # a failed read is not cached: the next round asks again
    assert pods.lists == 3


# --- this machine's real cgroup v1 filesystem


def _writable_v1_root() -> Path | None:
    root = Path("/sys/fs/cgroup")
    needed = [root / h for h in ("cpu", "cpuacct", "memory")]
    if (root / "cgroup.controllers").exists() or not all(p.is_dir() and os.access(p, os.W_OK) for p in needed):
        return None
    return root


def _rmdirs(tops: list[Path]) -> None:
    for top in tops:
        if top.exists():
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                directory.rmdir()
            top.rmdir()


@pytest.mark.cgroup
async def test_real_cgroup_v1_values_are_applied_and_read_back(tmp_path: Path) -> None:
    root = _writable_v1_root()
    if root is None:
        pytest.skip("needs a writable cgroup v1 filesystem (cpu, cpuacct, memory) at /sys/fs/cgroup")
    parent = f"koordbus-test-{uuid.uuid4().hex[:12]}"
    pod = f"kubepods/besteffort/pod{UID}"
    tops = [root / h / parent for h in ("cpu", "cpuacct", "memory")]
    try:
        try:
            for hierarchy in ("cpu", "cpuacct", "memory"):
                (root / hierarchy / parent / pod / CID).mkdir(parents=True)
        except OSError as e:
            pytest.skip(f"the kernel refuses new cgroups under {root}: {e}")
        bus = await slo_bus({})
        qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=root, parent=parent)
        (event,) = await qos_loops.round()
        assert event.problems == [], event.problems
        for directory in (pod, f"{pod}/{CID}"):
            cpu, memory = root / "cpu" / parent / directory, root / "memory" / parent / directory
            assert (cpu / "cpu.shares").read_text().strip() == "2048"
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "400000"
            assert (memory / "memory.limit_in_bytes").read_text().strip() == str(8 * GI)
        assert await qos_loops.round() == []  # the kernel's values read back equal: nothing to do
        # A smaller limit: the container is lowered before the pod (the kernel refuses a child above its parent
        # only for some controllers, but the order must hold everywhere).
        smaller = be_pod(
            annotation={
                "containers": {
                    "main": {
                        "requests": {"kubernetes.io/batch-cpu": "1000"},
                        "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"},
                    }
                }
            }
        )
        qos_loops._pods = StaticPods(smaller)
        (event,) = await qos_loops.round()
        order = [c.path for c in event.changes if c.path.endswith("memory.limit_in_bytes")]
        assert order == [
            f"memory/{parent}/{pod}/{CID}/memory.limit_in_bytes",
            f"memory/{parent}/{pod}/memory.limit_in_bytes",
        ]
        assert (root / "memory" / parent / pod / "memory.limit_in_bytes").read_text().strip() == str(GI)
        # The kernel refuses a CFS quota above a limited parent's (EINVAL): reported per file, the rest applied.
        (root / "cpu" / parent / "kubepods/besteffort/cpu.cfs_quota_us").write_text("100000")
        qos_loops._pods = StaticPods(be_pod())
        events = {e.loop: e for e in await qos_loops.round()}
        event = events["be-cgroup"]
        refused = {p.target for p in event.problems if "refused" in p.reason}
        assert refused == {f"cpu/{parent}/{pod}/cpu.cfs_quota_us", f"cpu/{parent}/{pod}/{CID}/cpu.cfs_quota_us"}
        assert (root / "cpu" / parent / pod / "cpu.cfs_quota_us").read_text().strip() == "100000"
        assert (root / "memory" / parent / pod / "memory.limit_in_bytes").read_text().strip() == str(8 * GI)
        # CPU suppress is off: the besteffort quota someone set is released afterwards in the same round (§5.5.1)
        assert events["cpu-suppress"].changes[0].after == "-1"
        assert (root / "cpu" / parent / "kubepods/besteffort/cpu.cfs_quota_us").read_text().strip() == "-1"
    finally:
        _rmdirs(tops)


# --- CPU suppress (§5.5.1)

LS_UID = "3f1e2d3c-0000-4000-8000-0000000000ff"


def sys_tree(root: Path, cpus: int = 8) -> Path:
    """A sysfs with `cpus` CPUs on one socket, CPU n on core n mod cpus/2 (so n and n + cpus/2 are siblings)."""
    base = root / "devices/system/cpu"
    base.mkdir(parents=True)
    (base / "online").write_text(f"0-{cpus - 1}\n")
    for cpu in range(cpus):
        (base / f"cpu{cpu}/topology").mkdir(parents=True)
        (base / f"cpu{cpu}/topology/core_id").write_text(f"{cpu % (cpus // 2)}\n")
        (base / f"cpu{cpu}/topology/physical_package_id").write_text("0\n")
    (root / "devices/system/node/node0").mkdir(parents=True)
    (root / "devices/system/node/node0/cpulist").write_text(f"0-{cpus - 1}\n")
    return root


def cpuset_tree(cg: Path) -> list[Path]:
    pod = f"kubepods/besteffort/pod{UID}"
    files = []
    for directory in ("kubepods/besteffort", pod, f"{pod}/{CID}"):
        (cg / "cpuset" / directory).mkdir(parents=True, exist_ok=True)
        (cg / "cpuset" / directory / "cpuset.cpus").write_text("0-7\n")
        files.append(cg / "cpuset" / directory / "cpuset.cpus")
    return files


def tick(at: float, *, node: float, be: float, ls: float) -> Tick:
    def pod(uid: str, cores: float) -> PodSample:
        return PodSample(pod=PodRef(uid=uid), sample=(at, cores, 0), memory_with_page_cache=0)

    return Tick(
        at=at, node=(at, node, 0), node_memory_with_page_cache=0, system=None, pods=(pod(UID, be), pod(LS_UID, ls))
    )


async def test_cpu_suppress_cpuset_policy_shrinks_and_grows_be_cpus_within_bounds(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    files = v1_tree(cg)
    cpusets = cpuset_tree(cg)
    clock = Clock()
    usage = [tick(T0, node=6.0, be=1.0, ls=3.0)]
    spec = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}}
    bus = await slo_bus(spec)
    ls = be_pod(LS_UID, label="LS", name="web", kube_qos="Burstable")
    qos_loops = loops(
        tmp_path, bus, StaticPods(be_pod(), ls), cgroup_root=cg, clock=clock, sys_root=sys_tree(tmp_path / "sys")
    )
    qos_loops._usage = lambda: usage[0]
    events = {e.loop: e for e in await qos_loops.round()}
    # 8000m × 65% − LS 3000m − system (6000 − 4000) = 200m → the minimum of 2 CPUs, a sibling pair
    assert [f.read_text().strip() for f in cpusets] == ["0,4", "0,4", "0,4"]
    change = events["cpu-suppress"].changes[0]
    assert "= 200m" in change.reason and change.before == "0-7" and change.after == "0,4"
    assert values(files)["cpu/kubepods/besteffort/cpu.cfs_quota_us"] == "-1"
    # Load drops: BE may use 4200m → 5 CPUs, but it grows by at most ceil(10% of 8) = 1 CPU per round.
    clock.now += 1
    usage[0] = tick(clock.now, node=2.0, be=1.0, ls=0.5)
    await qos_loops.round()
    assert len(suppress.parse_cpuset(cpusets[0].read_text())) == 3
    assert all(f.read_text() == cpusets[0].read_text() for f in cpusets)
    # A stale sample: nothing moves, the problem is said once.
    clock.now += 10
    (event,) = [e for e in await qos_loops.round() if e.loop == "cpu-suppress"]
    assert "no fresh CPU usage sample" in event.problems[0].reason


async def test_cpu_suppress_cpuset_change_larger_than_the_write_bound_finishes_over_rounds(tmp_path: Path) -> None:
    """More cpuset directories than one round may write: each round moves what it may, never leaving a child with
    a CPU its parent lacks, and the change completes (it once stayed deferred for ever)."""
    cg = tmp_path / "cg"
    v1_tree(cg)
    cpusets = cpuset_tree(cg)  # besteffort, the pod, its container
    second = cg / "cpuset" / "kubepods/besteffort/pod-other-uid"  # a second BE cgroup: 4 directories in all
    second.mkdir()
    (second / "cpuset.cpus").write_text("0-7\n")
    cpusets.append(second / "cpuset.cpus")
    clock = Clock()
    usage = [tick(T0, node=6.0, be=1.0, ls=3.0)]
    bus = await slo_bus({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}})
    ls = be_pod(LS_UID, label="LS", name="web", kube_qos="Burstable")
    qos_loops = loops(
        tmp_path,
        bus,
        StaticPods(be_pod(), ls),
        cgroup_root=cg,
        clock=clock,
        sys_root=sys_tree(tmp_path / "sys"),
        max_writes_per_round=3,
    )
    qos_loops._usage = lambda: usage[0]

    def cpus() -> list[set[int]]:
        return [suppress.parse_cpuset(f.read_text()) for f in cpusets]

    def parents_hold_their_children() -> bool:
        top, pod, container, other = cpus()
        return container <= pod <= top and other <= top

    deferred = []
    for _ in range(8):  # the static pass's own writes take the first rounds' bound too
        events = {e.loop: e for e in await qos_loops.round()}
        deferred.append(events["cpu-suppress"].deferred if "cpu-suppress" in events else 0)
        assert parents_hold_their_children()
        clock.now += 1
        usage[0] = tick(clock.now, node=6.0, be=1.0, ls=3.0)
    assert cpus() == [{0, 4}] * 4
    assert max(deferred) > 0  # it did take more than one round
    # Growing again under the same bound: parents are widened first, then the rest follows in later rounds.
    usage[0] = tick(clock.now, node=0.5, be=0.2, ls=0.1)
    sizes = []
    for _ in range(6):
        await qos_loops.round()
        assert parents_hold_their_children()
        sizes.append(len(cpus()[0]))
        clock.now += 1
        usage[0] = tick(clock.now, node=0.5, be=0.2, ls=0.1)
    # 5200m − LS 100m − system 200m = 4900m → 5 CPUs, reached one CPU per round (the growth limit)
    assert sizes == [3, 4, 5, 5, 5, 5]
    assert all(c == cpus()[0] for c in cpus())


async def test_cpu_suppress_cfs_quota_policy_and_release_when_off(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    files = v1_tree(cg)
    cpusets = cpuset_tree(cg)
    cpusets[0].write_text("0,4\n")  # left by an earlier cpuset policy
    clock = Clock()
    spec = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
    bus = await slo_bus(spec)
    qos_loops = loops(
        tmp_path, bus, StaticPods(be_pod()), cgroup_root=cg, clock=clock, sys_root=sys_tree(tmp_path / "sys")
    )
    qos_loops._usage = lambda: tick(clock.now, node=4.0, be=1.0, ls=1.0)
    await qos_loops.round()
    quota = "cpu/kubepods/besteffort/cpu.cfs_quota_us"
    # 5200m − non-BE 1000m (the LS sample, a pod the list does not have) − system 2000m = 2200m → 220000 µs
    assert values(files)[quota] == "220000"
    assert [f.read_text().strip() for f in cpusets] == ["0-7", "0-7", "0-7"]  # the cpuset is given back
    # Switched off: the quota is released.
    await put_slo(bus, {"resourceUsedThresholdWithBE": {"enable": False}})
    clock.now += 10
    await qos_loops.round()
    assert values(files)[quota] == "-1"


async def test_cpu_suppress_psi_rule_is_opt_in_and_lowers_be_quota_under_ls_cpu_pressure(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    files = v1_tree(cg)
    cpuset_tree(cg)
    clock = Clock()
    spec = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
    ls = be_pod(LS_UID, label="LS", name="web", kube_qos="Burstable")
    quota = "cpu/kubepods/besteffort/cpu.cfs_quota_us"

    def pressed(stall: float) -> Tick:
        plain = tick(clock.now, node=4.0, be=1.0, ls=1.0)
        pods = tuple(
            msgspec.structs.replace(p, psi=PsiSample(t=clock.now, cpu_some=stall)) if p.pod.uid == LS_UID else p
            for p in plain.pods
        )
        return msgspec.structs.replace(plain, pods=pods)

    default = loops(
        tmp_path,
        await slo_bus(spec),
        StaticPods(be_pod(), ls),
        cgroup_root=cg,
        clock=clock,
        sys_root=sys_tree(tmp_path / "sys"),
    )
    default._usage = lambda: pressed(0.9)
    await default.round()
    # off by default: 5200m − LS 1000m − system 2000m = 2200m, whatever the pressure
    assert values(files)[quota] == "220000"

    (tmp_path / "state").mkdir(exist_ok=True)
    stall = [0.5]
    opted = loops(
        tmp_path,
        await slo_bus(spec),
        StaticPods(be_pod(), ls),
        cgroup_root=cg,
        clock=clock,
        sys_root=sys_tree(tmp_path / "sys2"),
        psi_suppress_threshold=0.4,
        psi_suppress_step_percent=10,
    )
    opted._usage = lambda: pressed(stall[0])
    clock.now += 10
    events = {e.loop: e for e in await opted.round()}
    # 2200m − the step of 10% of 8 CPUs (800m) = 1400m
    assert values(files)[quota] == "140000"
    assert "LS CPU pressure step 800m" in events["cpu-suppress"].changes[0].reason
    stall[0] = 0.1  # the pressure is gone: the budget comes back (growth capped at 10% of the node per round)
    clock.now += 10
    await opted.round()
    assert values(files)[quota] == "220000"


# --- CPU burst (§5.6)


def burstable_tree(cg: Path, *, kernel_burst: bool = True) -> dict[str, Path]:
    qos_dir = cg / "cpu/kubepods/burstable"
    pod = qos_dir / f"pod{LS_UID}"
    files: dict[str, Path] = {}
    for directory, quota in ((qos_dir, "-1"), (pod, "200000"), (pod / CID, "200000")):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.cfs_quota_us").write_text(quota + "\n")
        (directory / "cpu.stat").write_text("nr_periods 10\nnr_throttled 2\nthrottled_time 0\n")
        if kernel_burst:
            (directory / "cpu.cfs_burst_us").write_text("0\n")
        files[str(directory.relative_to(cg))] = directory
    return files


def burst_pod() -> actuate.NodePod:
    pod = msgspec.convert(
        {
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": LS_UID,
                "labels": {"koordinator.sh/qosClass": "LS"},
            },
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"cpu": "2"}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable"},
        },
        kube.Pod,
    )
    return actuate.NodePod(pod=pod, containers={"main": ("containerd", CID)})


async def test_cpu_burst_sets_cfs_burst_and_scales_quota_with_throttling_and_the_pool(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    v1_tree(cg)
    dirs = burstable_tree(cg)
    pod_dir, container_dir = (
        dirs[f"cpu/kubepods/burstable/pod{LS_UID}"],
        dirs[f"cpu/kubepods/burstable/pod{LS_UID}/{CID}"],
    )
    clock = Clock()
    bus = await slo_bus({"cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 500}})
    qos_loops = loops(
        tmp_path, bus, StaticPods(burst_pod()), cgroup_root=cg, clock=clock, sys_root=sys_tree(tmp_path / "sys")
    )
    node_use = [1.0]
    qos_loops._usage = lambda: Tick(
        at=clock.now, node=(clock.now, node_use[0], 0), node_memory_with_page_cache=0, system=None
    )
    events = {e.loop: e for e in await qos_loops.round()}
    assert (container_dir / "cpu.cfs_burst_us").read_text() == "1000000"  # 2 cores × 500% × 100000 µs
    assert (pod_dir / "cpu.cfs_burst_us").read_text() == "1000000"
    assert (container_dir / "cpu.cfs_quota_us").read_text().strip() == "200000"  # no throttling data yet
    assert {c.path.rsplit("/", 1)[-1] for c in events["cpu-burst"].changes} == {"cpu.cfs_burst_us"}
    # Throttled 30% of the last periods and the pool idle (1 of 8 cores): scale up, the pod before its container.
    clock.now += 1
    (container_dir / "cpu.stat").write_text("nr_periods 20\nnr_throttled 5\n")
    (event,) = [e for e in await qos_loops.round() if e.loop == "cpu-burst"]
    assert [(c.path.count("/"), c.after) for c in event.changes] == [(4, "240000"), (5, "240000")]
    assert "scaleUp" in event.changes[0].reason
    # The pool gets overloaded (7 of 8 cores, averaged over the last 5 s, reach 50%): scale down, the container
    # before its pod, never below the base.
    node_use[0] = 7.0
    downs = []
    for _ in range(3):
        clock.now += 1
        downs += [e for e in await qos_loops.round() if e.loop == "cpu-burst"]
    (event,) = downs
    assert "scaleDown" in event.changes[0].reason and "pool overload" in event.changes[0].reason
    assert [(c.path.count("/"), c.after) for c in event.changes] == [(5, "200000"), (4, "200000")]


async def test_cpu_burst_on_a_kernel_without_cfs_burst_is_one_problem(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    v1_tree(cg)
    burstable_tree(cg, kernel_burst=False)
    bus = await slo_bus({"cpuBurstStrategy": {"policy": "cpuBurstOnly"}})
    qos_loops = loops(tmp_path, bus, StaticPods(burst_pod()), cgroup_root=cg, sys_root=sys_tree(tmp_path / "sys"))
    events = {e.loop: e for e in await qos_loops.round()}
    assert [p.target for p in events["cpu-burst"].problems] == ["cpu.cfs_burst_us"]
    assert "cpu-burst" not in {e.loop for e in await qos_loops.round()}


async def test_static_loops_run_on_change_or_every_reconcile_interval(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    clock = Clock()
    bus = await slo_bus({})
    qos_loops = loops(
        tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg", clock=clock, reconcile_interval=10
    )
    await qos_loops.round()
    shares = f"cpu/kubepods/besteffort/pod{UID}/cpu.shares"
    files[shares].write_text("1024\n")  # the kubelet put its own value back
    clock.now += 1
    await qos_loops.round()
    assert values(files)[shares] == "1024"  # nothing changed in the inputs, the next pass is not due yet
    clock.now += 10
    await qos_loops.round()
    assert values(files)[shares] == "2048"  # the periodic pass repairs it
    files[shares].write_text("1024\n")
    await put_slo(bus, {"cpuBurstStrategy": {"policy": "auto"}})  # a new NodeSLO revision: a pass at once
    clock.now += 6  # past the 5 s NodeSLO poll
    await qos_loops.round()
    assert values(files)[shares] == "2048"


async def test_a_malformed_nodeslo_keeps_the_previous_one_whole(tmp_path: Path) -> None:
    v1_tree(tmp_path / "cg")
    clock = Clock()
    good = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
    bus = await slo_bus(good)
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg", clock=clock)
    await qos_loops.round()
    assert qos_loops.slo.spec == good and qos_loops.slo.revision == 1
    await put_slo(bus, {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 250}})
    clock.now += 6
    await qos_loops.round()
    assert qos_loops.slo.spec == good and qos_loops.slo.revision == 1 and qos_loops.slo.unreadable == 1
    await bus.publish(subjects.slo_key(NODE), b"{not json", msg_id="broken")
    clock.now += 6
    await qos_loops.round()
    assert qos_loops.slo.spec == good and qos_loops.slo.unreadable == 2
    clock.now += 6
    await qos_loops.round()
    assert qos_loops.slo.unreadable == 2  # a refused revision is not read again


async def test_one_failing_loop_does_not_stop_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = v1_tree(tmp_path / "cg")
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=tmp_path / "cg")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("an input nobody foresaw")

    monkeypatch.setattr(agent.loops.runner, "cpu_suppress", broken)
    events = {e.loop: e for e in await qos_loops.round()}
    assert events["cpu-suppress"].problems[0].reason == "RuntimeError: an input nobody foresaw"
    assert (
        len(events["be-cgroup"].changes) == 6
        and values(files)[f"cpu/kubepods/besteffort/pod{UID}/cpu.shares"] == "2048"
    )


def _lse_pod(uid: str, cpuset: str, qos: str = "LSE") -> actuate.NodePod:
    """A Guaranteed pod the scheduler gave `cpuset` (its resource-status annotation)."""
    pod = msgspec.convert(
        {
            "metadata": {
                "name": f"{qos.lower()}-{uid[-2:]}",
                "namespace": "web",
                "uid": uid,
                "labels": {"koordinator.sh/qosClass": qos},
                "annotations": {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpuset})},
            },
            "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": "Running", "qosClass": "Guaranteed"},
        },
        kube.Pod,
    )
    return actuate.NodePod(pod=pod)


async def test_be_never_gets_reserved_or_lse_cpus_under_either_policy_or_when_released(tmp_path: Path) -> None:
    """Issue 23 point 3: with CPU 0 reserved (--reserved-cpus) and CPUs 1-2 an LSE pod's, the BE cpuset leaves them
    out on the cpuset policy, on the cfsQuota policy and when suppress is off; CPU 3, an LSR pod's, is BE's only in
    the LSR pool's share."""
    cg = tmp_path / "cg"
    v1_tree(cg)
    cpusets = cpuset_tree(cg)
    clock = Clock()
    bus = await slo_bus({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 100}})
    pods = StaticPods(be_pod(), _lse_pod(LS_UID, "1-2"), _lse_pod(LS_UID[:-2] + "ee", "3", qos="LSR"))
    qos_loops = loops(
        tmp_path, bus, pods, cgroup_root=cg, clock=clock, sys_root=sys_tree(tmp_path / "sys"), reserved_cpus="0"
    )
    qos_loops._usage = lambda: tick(clock.now, node=1.5, be=0.5, ls=0.5)
    events = {e.loop: e for e in await qos_loops.round()}
    # 8000m × 100% − LS 500m − system max(1500 − 1000, 1 reserved CPU = 1000m) = 6500m → 7 CPUs, but BE may have
    # only 3-7 (5 CPUs) and grows by at most 1 per round from the 8 it had: the 5 it may have
    first = suppress.parse_cpuset(cpusets[0].read_text())
    assert first == {3, 4, 5, 6, 7}, first
    assert all(f.read_text() == cpusets[0].read_text() for f in cpusets)
    reason = events["cpu-suppress"].changes[-1].reason
    assert "not LSE pods' 1-2, reserved 0" in reason, reason
    await put_slo(bus, {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}})
    clock.now += 10
    await qos_loops.round()
    assert suppress.parse_cpuset(cpusets[0].read_text()) == {3, 4, 5, 6, 7}  # "every CPU" BE may have
    await put_slo(bus, {"resourceUsedThresholdWithBE": {"enable": False}})
    clock.now += 10
    await qos_loops.round()
    assert suppress.parse_cpuset(cpusets[0].read_text()) == {3, 4, 5, 6, 7}
    assert all(f.read_text() == cpusets[0].read_text() for f in cpusets)


async def test_a_new_be_pods_cgroups_are_set_as_they_appear_not_at_the_next_pod_poll(tmp_path: Path) -> None:
    """Issue 23 point 7: with the pod poll and the round a minute apart, a BE pod whose cgroup directories appear
    gets its limits at once (inotify on the besteffort directories wakes the loop, which reads the pods again)."""
    cg = tmp_path / "cg"
    v1_tree(cg, pod_dirs=False)  # kubepods/besteffort only: no pod yet
    bus = await slo_bus({})
    pods = StaticPods()
    qos_loops = loops(tmp_path, bus, pods, cgroup_root=cg, round_interval=60.0, pods_poll_interval=60.0)
    task = asyncio.create_task(qos_loops.run())
    try:
        await eventually(lambda: qos_loops.stats.rounds >= 1)
        lists = pods.lists
        pods.pods.append(be_pod())
        files = v1_tree(cg)  # the kubelet makes the pod's and its container's cgroups (one step for the loop)
        shares = files[f"cpu/kubepods/besteffort/pod{UID}/{CID}/cpu.shares"]
        await eventually(lambda: shares.read_text().strip() == "2048", timeout=5)
        assert qos_loops.stats.cgroup_wakeups >= 1 and pods.lists > lists
        assert values(files)[f"memory/kubepods/besteffort/pod{UID}/memory.limit_in_bytes"] == str(8 * GI)
    finally:
        await qos_loops.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_system_config_writes_the_memory_sysctls_and_restores_them_when_turned_off(tmp_path: Path) -> None:
    """Issue 23 point 1 (system settings): on a generated proc and sys tree, the NodeSLO's systemStrategy becomes
    min_free_kbytes and watermark_scale_factor (reap_background only where the file exists); turned off, the values
    the agent changed are written back from its state dir."""
    cg = tmp_path / "cg"
    v1_tree(cg)
    proc = tmp_path / "proc"
    (proc / "sys/vm").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {64 * 1024 * 1024} kB\nMemFree: 0 kB\nMemAvailable: 0 kB\n")
    (proc / "sys/vm/min_free_kbytes").write_text("67584\n")
    (proc / "sys/vm/watermark_scale_factor").write_text("10\n")
    sys_root = sys_tree(tmp_path / "sys")  # no memcg_reaper: reap_background is left alone, silently
    bus = await slo_bus({"systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150}})
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=cg, sys_root=sys_root, system_config=True)
    events = {e.loop: e for e in await qos_loops.round()}
    assert (proc / "sys/vm/min_free_kbytes").read_text() == "671088"
    assert (proc / "sys/vm/watermark_scale_factor").read_text() == "150"
    changes = {c.path: (c.before, c.after) for c in events["system-config"].changes}
    assert changes == {
        "proc/sys/vm/min_free_kbytes": ("67584", "671088"),
        "proc/sys/vm/watermark_scale_factor": ("10", "150"),
    }
    assert events["system-config"].problems == []
    # the agent restarts with the loop off: what it changed goes back, once
    off = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=cg, sys_root=sys_root)
    events = {e.loop: e for e in await off.round()}
    assert (proc / "sys/vm/min_free_kbytes").read_text() == "67584"
    assert (proc / "sys/vm/watermark_scale_factor").read_text() == "10"
    assert len(events["system-config"].changes) == 2
    assert "system-config" not in {
        e.loop for e in await loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=cg, sys_root=sys_root).round()
    }


async def test_memory_qos_on_v2_and_one_problem_on_a_v1_kernel_without_the_files(tmp_path: Path) -> None:
    """Issue 23 point 1 (memory QoS): beClass memoryQOS on (min 50 %, low 80 %, throttling 90 %) gives the BE
    container memory.min / low / high from its batch-memory (4 GiB request, 8 GiB limit) on cgroup v2; on a cgroup v1
    tree without memory.min it is one problem saying the kernel lacks the files, and nothing is written."""
    spec = {
        "resourceQOSStrategy": {
            "beClass": {
                "memoryQOS": {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 90}
            }
        }
    }
    cg = tmp_path / "cg"
    v2_tree(cg)
    slice_uid = UID.replace("-", "_")
    container = cg / f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{slice_uid}.slice"
    container = container / f"cri-containerd-{CID}.scope"
    for name, value in (("memory.min", "0"), ("memory.low", "0"), ("memory.high", "max")):
        (container / name).write_text(value + "\n")
    (cg / "kubepods.slice/memory.min").write_text("0\n")
    bus = await slo_bus(spec)
    qos_loops = loops(tmp_path, bus, StaticPods(be_pod()), cgroup_root=cg, driver="systemd")
    events = {e.loop: e for e in await qos_loops.round()}
    assert (container / "memory.min").read_text() == str(2 * GI)
    assert (container / "memory.low").read_text() == str(4 * GI * 80 // 100)
    assert (container / "memory.high").read_text() == str((4 * GI + 4 * GI * 90 // 100) // 4096 * 4096)
    assert len(events["memory-qos"].changes) == 3 and events["memory-qos"].problems == []
    # turned off: the memory is given back (the none values), then the loop rests
    await put_slo(bus, {"resourceQOSStrategy": {"beClass": {"memoryQOS": {"enable": False}}}})
    qos_loops._next_slo_read = 0.0
    qos_loops._next_reconcile = 0.0
    await qos_loops.round()
    assert [(container / n).read_text() for n in ("memory.min", "memory.low", "memory.high")] == ["0", "0", "max"]
    qos_loops._next_reconcile = 0.0
    assert "memory-qos" not in {e.loop for e in await qos_loops.round()}

    await put_slo(bus, spec)
    v1 = tmp_path / "v1"
    files = v1_tree(v1)
    before = values(files)
    (tmp_path / "other").mkdir()
    v1_loops = loops(tmp_path / "other", bus, StaticPods(be_pod()), cgroup_root=v1)
    events = {e.loop: e for e in await v1_loops.round()}
    (problem,) = events["memory-qos"].problems
    assert "not supported by this kernel" in problem.reason and events["memory-qos"].changes == []
    assert {k: v for k, v in values(files).items() if "memory.min" in k} == {}
    assert before.keys() == values(files).keys()
