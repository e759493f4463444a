"""The agent's PSI on disk (issue 23, point 6): the collector over generated /proc/pressure and pod pressure files
(cgroup v2, and v1 where the files exist), through the sampler into the batch the agent publishes; a node without
them reports nothing and says so once; the batch fields are validated on decode; and this machine's real
/proc/pressure and cgroup v2 pressure files where the kernel has them."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import msgspec
import pytest

from agent import collect, core
from agent.batch import BatchBuilder
from agent.psi import PsiSampler
from schemas.node import NODE_EVENT_DECODER, MetricCollectPolicy, NodeMetricsReported, PodRef, encode_node_event
from schemas.psi import PodPsiColumns, PsiSample
from services.nodemetric.window import NodeWindow
from tests.cgroup_tree import FakeCgroupTree, MiB, pod_rel
from tests.integration.test_agent_collect import UID_B, UID_G, advance, settings_for


def pressure_text(some_us: int, full_us: int | None) -> str:
    text = f"some avg10=0.10 avg60=0.20 avg300=0.30 total={some_us}\n"
    return text if full_us is None else text + f"full avg10=0.00 avg60=0.00 avg300=0.00 total={full_us}\n"


class PressureNode:
    """A FakeCgroupTree with pressure files for the node and both pods; `advance` adds stall time to them."""

    def __init__(self, tmp_path: Path, version: int, *, node: bool = True, pods: bool = True) -> None:
        self.tree = FakeCgroupTree(root=tmp_path / "node", version=version, driver="cgroupfs")
        self.tree.add_pod(UID_G, "Guaranteed", active_anon=300 * MiB)
        self.tree.add_pod(UID_B, "Burstable", active_anon=100 * MiB)
        self.node, self.pods = node, pods
        self.totals: dict[str, dict[str, list[int]]] = {
            who: {r: [1_000_000, 500_000] for r in ("cpu", "memory", "io")} for who in ("node", UID_G, UID_B)
        }
        self.write()

    def pod_dir(self, uid: str) -> Path:
        kube_qos = "Guaranteed" if uid == UID_G else "Burstable"
        base = self.tree.cgroup_root if self.tree.version == 2 else self.tree.cgroup_root / "cpuacct"
        return base / pod_rel(self.tree.driver, uid, kube_qos)

    def write(self) -> None:
        self.tree.write()
        if self.node:
            d = self.tree.proc_root / "pressure"
            d.mkdir(exist_ok=True)
            for r, (some, full) in self.totals["node"].items():
                (d / r).write_text(pressure_text(some, None if r == "cpu" else full))  # cpu: a pre-5.13 kernel
        if self.pods:
            for uid in (UID_G, UID_B):
                for r, (some, full) in self.totals[uid].items():
                    (self.pod_dir(uid) / f"{r}.pressure").write_text(pressure_text(some, full))

    def advance(self, seconds: float, stalled: dict[str, dict[str, tuple[float, float]]]) -> None:
        """`stalled[who][resource]` = (some, full) share of the interval."""
        for who, by_resource in stalled.items():
            for r, (some, full) in by_resource.items():
                self.totals[who][r][0] += int(some * seconds * 1e6)
                self.totals[who][r][1] += int(full * seconds * 1e6)
        advance(self.tree, seconds)
        self.write()


STALLED = {
    "node": {"cpu": (0.25, 0.0), "memory": (0.1, 0.05), "io": (0.5, 0.2)},
    UID_G: {"cpu": (0.4, 0.1), "memory": (0.0, 0.0), "io": (0.02, 0.01)},
    UID_B: {"cpu": (0.05, 0.0), "memory": (0.3, 0.2), "io": (0.0, 0.0)},
}


def publish_round_trip(batch: NodeMetricsReported) -> NodeMetricsReported:
    decoded = NODE_EVENT_DECODER.decode(encode_node_event(batch))
    assert isinstance(decoded, NodeMetricsReported)
    return decoded


@pytest.mark.parametrize("version", [1, 2])
def test_node_and_pod_pressure_reach_the_batch_as_stall_ratios(tmp_path: Path, version: int) -> None:
    machine = PressureNode(tmp_path, version)
    collector = collect.Collector(settings_for(machine.tree))
    sampler = core.Sampler()
    builder = BatchBuilder("node-a.example", interval=10.0)

    first = sampler.observe(collector(1000.0))
    assert first.node_psi is None  # the first reading gives no ratio
    builder.add(first)
    for at in (1002.0, 1004.0):
        machine.advance(2.0, STALLED)
        tick = sampler.observe(collector(at))
        assert tick.node_psi is not None
        assert tick.node_psi.values() == pytest.approx((0.25, None, 0.1, 0.05, 0.5, 0.2))
        pods = {ps.pod.uid: ps.psi for ps in tick.pods}
        assert pods[UID_G] is not None and pods[UID_B] is not None
        assert pods[UID_G].values() == pytest.approx((0.4, 0.1, 0.0, 0.0, 0.02, 0.01))
        assert pods[UID_B].values() == pytest.approx((0.05, 0.0, 0.3, 0.2, 0.0, 0.0))
        builder.add(tick)
    batch = builder.close(sent_at=1010.0)
    assert batch is not None
    got = publish_round_trip(batch)
    assert [s.t for s in got.node_psi] == [1002.0, 1004.0]
    assert all(s.cpu_full is None for s in got.node_psi)  # absent, not zero
    by_uid: dict[str, list[PsiSample]] = {}
    for index, sample in got.pod_psi.rows():
        by_uid.setdefault(got.pods[index].uid, []).append(sample)
    assert set(by_uid) == {UID_G, UID_B}
    assert [s.cpu_some for s in by_uid[UID_G]] == pytest.approx([0.4, 0.4])
    assert all(s.io_full is not None for s in by_uid[UID_B])


def test_a_node_without_pressure_files_reports_nothing_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    machine = PressureNode(tmp_path, 1, node=False, pods=False)
    collector = collect.Collector(settings_for(machine.tree))
    sampler = core.Sampler()
    builder = BatchBuilder("node-a.example", interval=10.0)
    with caplog.at_level(logging.INFO, logger="agent.collect"):
        for at in (1000.0, 1001.0, 1002.0, 1003.0):
            reading = collector(at)
            assert reading.psi is None and all(p.psi is None for p in reading.pods)
            tick = sampler.observe(reading)
            assert tick.node_psi is None and all(ps.psi is None for ps in tick.pods)
            builder.add(tick)
            machine.advance(1.0, {})
    batch = builder.close(sent_at=1010.0)
    assert batch is not None and batch.node_psi == [] and len(batch.pod_psi) == 0
    wire = msgspec.msgpack.decode(encode_node_event(batch))
    assert "node_psi" not in wire and "pod_psi" not in wire  # nothing on the wire, no zeros
    unavailable = [r.getMessage() for r in caplog.records if "PSI not available" in r.getMessage()]
    assert len(unavailable) == 2, unavailable  # once for the node, once for the pods, not per collection
    assert all(r.levelno == logging.INFO for r in caplog.records if "PSI not available" in r.getMessage())
    assert any("pressure/cpu does not exist" in m and "no node pressure" in m for m in unavailable)
    assert any("<pod cgroup>/cpu.pressure does not exist" in m and "no pod pressure" in m for m in unavailable)


def test_a_malformed_pressure_file_costs_that_resource_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    machine = PressureNode(tmp_path, 2)
    (machine.tree.proc_root / "pressure" / "io").write_text("some avg10=0.10 avg60=0.2")  # truncated
    with caplog.at_level(logging.WARNING, logger="agent.collect"):
        reading = collect.Collector(settings_for(machine.tree))(1000.0)
    assert reading.psi is not None and reading.psi.io is None and reading.psi.cpu is not None
    assert any("PSI partly available" in r.getMessage() and "pressure/io" in r.getMessage() for r in caplog.records)


def batch_with(**fields: object) -> bytes:
    base = NodeMetricsReported(
        node="node-a.example",
        window_start=1000.0,
        window_end=1010.0,
        sent_at=1010.0,
        pods=[PodRef(uid=UID_G)],
    )
    return encode_node_event(msgspec.structs.replace(base, **fields))


def test_psi_fields_are_checked_on_decode_naming_the_field() -> None:
    sample = PsiSample(t=1001.0, cpu_some=0.5)
    got = NODE_EVENT_DECODER.decode(batch_with(node_psi=[sample], pod_psi=PodPsiColumns.of([(0, sample)])))
    assert isinstance(got, NodeMetricsReported) and got.pod_psi.rows() == [(0, sample)]
    bad_ratio = batch_with(node_psi=[PsiSample(t=1001.0, io_full=1.5)])
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.node_psi\[0\]"):
        NODE_EVENT_DECODER.decode(bad_ratio)
    bad_pod_ratio = batch_with(pod_psi=PodPsiColumns.of([(0, sample), (0, PsiSample(t=1002.0, memory_full=-0.5))]))
    with pytest.raises(msgspec.ValidationError, match=r"`memory_full` row 1 is -0.5.*\$\.pod_psi"):
        NODE_EVENT_DECODER.decode(bad_pod_ratio)
    out_of_range = batch_with(pod_psi=PodPsiColumns.of([(3, sample)]))
    with pytest.raises(msgspec.ValidationError, match=r"pod_psi: index 3 is out of range.*\$\.pod_psi"):
        NODE_EVENT_DECODER.decode(out_of_range)
    columns = PodPsiColumns.of([(0, sample), (0, sample)])
    ragged = batch_with(pod_psi=msgspec.structs.replace(columns, io_some=columns.io_some[:4]))
    with pytest.raises(msgspec.ValidationError, match=r"`io_some` has 1"):
        NODE_EVENT_DECODER.decode(ragged)
    two = [PodRef(uid=UID_G), PodRef(uid=UID_B)]
    ungrouped = encode_node_event(
        NodeMetricsReported(
            node="node-a.example",
            window_start=1000.0,
            window_end=1010.0,
            sent_at=1010.0,
            pods=two,
            pod_psi=PodPsiColumns.of([(1, sample), (0, sample)]),
        )
    )
    with pytest.raises(msgspec.ValidationError, match=r"grouped by pod"):
        NODE_EVENT_DECODER.decode(ungrouped)


def test_a_batch_from_before_psi_still_decodes() -> None:
    old = msgspec.msgpack.decode(batch_with())
    assert "node_psi" not in old and "pod_psi" not in old
    got = NODE_EVENT_DECODER.decode(msgspec.msgpack.encode(old))
    assert isinstance(got, NodeMetricsReported) and got.node_psi == [] and len(got.pod_psi) == 0


def test_this_machines_proc_pressure() -> None:
    if not os.path.exists("/proc/pressure/cpu"):
        pytest.skip("this kernel has no /proc/pressure (CONFIG_PSI off or booted with psi=0): nothing to read")
    first, problem = collect.read_node_pressure("/proc")
    if first is None:
        pytest.skip(f"/proc/pressure exists but cannot be read here: {problem}")
    time.sleep(0.2)
    second, _ = collect.read_node_pressure("/proc")
    assert second is not None and second.cpu is not None and second.cpu.some >= first.cpu.some  # type: ignore[union-attr]
    psi_sampler = PsiSampler()
    psi_sampler.observe_node(first, at=0.0, wall_seconds=0.0)
    sample = psi_sampler.observe_node(second, at=0.2, wall_seconds=0.2)
    assert sample is not None
    assert all(v is None or 0.0 <= v <= 1.0 for v in sample.values())
    assert sample.cpu_some is not None and sample.memory_some is not None and sample.io_some is not None


def test_the_agents_batches_give_the_nodemetric_psi_averages(tmp_path: Path) -> None:
    machine = PressureNode(tmp_path, 2)
    collector = collect.Collector(settings_for(machine.tree))
    sampler = core.Sampler()
    builder = BatchBuilder("node-a.example", interval=10.0)
    window = NodeWindow(MetricCollectPolicy())
    for second in range(0, 121):
        tick = sampler.observe(collector(1200.0 + second))
        if (batch := builder.add(tick)) is not None:
            window.add(publish_round_trip(batch))
        machine.advance(1.0, STALLED)
    metric = window.psi_metric(1320.0)
    assert metric is not None and metric.node is not None
    assert metric.node.io_some == pytest.approx(0.5, abs=1e-3) and metric.node.cpu_full is None
    by_uid = {p.uid: p.averages for p in metric.pods}
    assert by_uid[UID_G].cpu_some == pytest.approx(0.4, abs=1e-3)
    assert by_uid[UID_B].memory_full == pytest.approx(0.2, abs=1e-3)


def cgroup2_mounts() -> list[str]:
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if line.split()[2:3] == ["cgroup2"]]


def test_this_machines_cgroup_v2_pressure_files() -> None:
    dirs = [d for d in cgroup2_mounts() if os.path.exists(os.path.join(d, "cpu.pressure"))]
    if not dirs:
        pytest.skip("no cgroup v2 hierarchy with pressure files on this machine (no cgroup2 mount, or no PSI)")
    reading, problem = collect.read_pressure_files(
        [(r, os.path.join(dirs[0], f"{r}.pressure")) for r in ("cpu", "memory", "io")]
    )
    assert reading is not None, problem
    assert reading.cpu is not None and reading.cpu.some >= 0
    assert reading.memory is not None and reading.memory.full is not None  # memory always has a full line
