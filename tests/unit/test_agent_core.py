"""agent.core and agent.settings: cgroup name parsing, the spec §1.4 formulas, Sampler, BatchBuilder and Outbox."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import core
from agent.batch import BatchBuilder, Outbox, window_start_of
from agent.settings import AgentSettings, AgentSettingsError
from schemas.node import NODE_EVENT_DECODER, ContainerRef, PodRef, PodSampleColumns, encode_node_event
from tests.support import batches as wire

UID = "0e1f2a3b-4c5d-6e7f-8091-a2b3c4d5e6f7"
STATIC_UID = "6c9f2b1e0d8a4c3b2a1f0e9d8c7b6a59"
CID = "4f" * 32


# --- names


@pytest.mark.parametrize(
    ("name", "driver", "expected"),
    [
        (f"pod{UID}", "cgroupfs", (UID, "Guaranteed")),
        (f"pod{STATIC_UID}", "cgroupfs", (STATIC_UID, "Guaranteed")),
        (f"kubepods-pod{UID.replace('-', '_')}.slice", "systemd", (UID, "Guaranteed")),
        (f"kubepods-burstable-pod{UID.replace('-', '_')}.slice", "systemd", (UID, "Burstable")),
        (f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice", "systemd", (UID, "BestEffort")),
        (f"kubepods-besteffort-pod{STATIC_UID}.slice", "systemd", (STATIC_UID, "BestEffort")),
    ],
)
def test_pod_dir_names_of_both_drivers(name: str, driver: core.Driver, expected: tuple[str, str]) -> None:
    assert core.parse_pod_dir(name, driver) == expected


@pytest.mark.parametrize(
    ("name", "driver"),
    [
        ("burstable", "cgroupfs"),
        (f"pod{UID}/..", "cgroupfs"),
        (f"pod{UID.upper()}", "cgroupfs"),
        (f"pod{UID[:-1]}", "cgroupfs"),
        ("pod../../etc", "cgroupfs"),
        (f"kubepods-pod{UID.replace('-', '_')}.slice", "cgroupfs"),
        (f"pod{UID}", "systemd"),
        (f"kubepods-guaranteed-pod{UID.replace('-', '_')}.slice", "systemd"),
        (f"kubepods-burstable-pod{UID}.slice", "systemd"),  # dashes inside a systemd unit name are separators
        ("kubepods-burstable-pod__________________________________.slice", "systemd"),
        ("kubepods-burstable.slice", "systemd"),
    ],
)
def test_foreign_or_malformed_pod_dir_names_are_rejected(name: str, driver: core.Driver) -> None:
    assert core.parse_pod_dir(name, driver) is None


@pytest.mark.parametrize(
    ("name", "driver", "expected"),
    [
        (CID, "cgroupfs", CID),
        ("deadbeef", "cgroupfs", "deadbeef"),
        (f"cri-containerd-{CID}.scope", "systemd", CID),
        (f"docker-{CID}.scope", "systemd", CID),
        (f"crio-{CID}.scope", "systemd", CID),
        (f"cri-o-{CID}.scope", "systemd", CID),
        (f"crio-conmon-{CID}.scope", "systemd", None),
        (f"podman-{CID}.scope", "systemd", None),
        (f"docker-{CID}.scope", "cgroupfs", None),
        (CID, "systemd", None),
        ("../" + CID, "cgroupfs", None),
        ("cgroup.procs", "cgroupfs", None),
        ("ab" * 33, "cgroupfs", None),
    ],
)
def test_container_dir_names(name: str, driver: core.Driver, expected: str | None) -> None:
    assert core.parse_container_dir(name, driver) == expected


@given(st.text(max_size=80))
def test_anything_accepted_as_a_name_is_a_single_safe_path_component(name: str) -> None:
    drivers: tuple[core.Driver, ...] = ("cgroupfs", "systemd")
    for driver in drivers:
        parsed = core.parse_pod_dir(name, driver)
        if parsed is not None:
            assert core.is_pod_uid(parsed[0]) and "/" not in name and ".." not in name
        cid = core.parse_container_dir(name, driver)
        if cid is not None:
            assert core.is_container_id(cid) and "/" not in name


def test_qos_dirs() -> None:
    assert core.qos_dir("cgroupfs", "Burstable") == "burstable"
    assert core.qos_dir("systemd", "BestEffort") == "kubepods-besteffort.slice"
    assert core.qos_dir("systemd", "Guaranteed") == ""


@pytest.mark.parametrize("parent", ["/abs", "a/../b", "..", "a//b", "a/ b", "a/.hidden"])
def test_bad_kubepods_parents_are_rejected(parent: str) -> None:
    with pytest.raises(core.AgentNameError):
        core.validate_parent(parent)


def test_good_kubepods_parents() -> None:
    assert core.validate_parent("") == ""
    assert core.validate_parent("koordbus-test-1/node_a/") == "koordbus-test-1/node_a"


# --- settings


def test_settings_defaults_and_validation() -> None:
    s = AgentSettings(node_name="node-1.zone-a")
    assert AgentSettings(node_name="n", cgroup_version="2").cgroup_version == 2  # type: ignore[arg-type]
    assert (s.collect_interval, s.publish_interval, s.max_buffered_batches, s.state_interval) == (1.0, 10.0, 360, 300.0)
    for bad, message in [
        ({"node_name": "Node_1"}, "DNS-1123"),
        ({"node_name": "n", "collect_interval": 0}, "collect_interval"),
        ({"node_name": "n", "publish_interval": 0.5}, "publish_interval"),
        ({"node_name": "n", "max_buffered_batches": 0}, "max_buffered_batches"),
        ({"node_name": "n", "cgroup_version": 3}, "cgroup_version"),
        ({"node_name": "n", "kubepods_parent": "../escape"}, "kubepods_parent"),
        ({"node_name": "n", "cgroup_root": "relative"}, "cgroup_root"),
    ]:
        with pytest.raises(AgentSettingsError, match=message):
            AgentSettings(**bad)  # type: ignore[arg-type]


# --- formulas


def ticks(
    user: int = 0, system: int = 0, idle: int = 0, iowait: int = 0, steal: int = 0, irq: int = 0
) -> core.CpuTicks:
    return core.CpuTicks(user=user, nice=0, system=system, idle=idle, iowait=iowait, irq=irq, softirq=0, steal=steal)


def test_node_cpu_excludes_idle_iowait_and_steal() -> None:
    prev = ticks(user=1000, system=500, idle=9000, iowait=100, steal=10, irq=5)
    cur = ticks(user=1300, system=600, idle=9900, iowait=400, steal=210, irq=25)
    # busy Δ = 300 + 100 + 20 = 420 ticks over 2 s at 100 ticks/s = 2.1 cores
    assert core.node_cpu_cores(prev, cur, wall_seconds=2.0, ticks_per_second=100) == pytest.approx(2.1)
    assert core.node_cpu_cores(prev, cur, wall_seconds=0.0, ticks_per_second=100) is None
    assert core.node_cpu_cores(cur, prev, wall_seconds=2.0, ticks_per_second=100) is None


def test_cgroup_cpu_and_memory() -> None:
    assert core.cgroup_cpu_cores(5_000_000_000, 6_500_000_000, wall_seconds=2.0) == pytest.approx(0.75)
    assert core.cgroup_cpu_cores(6_500_000_000, 10, wall_seconds=1.0) is None
    stat = core.MemoryStat(inactive_anon=10, active_anon=20, unevictable=3, active_file=400, inactive_file=5000)
    assert core.cgroup_memory_bytes(stat) == 33
    assert core.cgroup_memory_with_page_cache(stat) == 5433
    mem = core.MemInfo(total_kb=1000, free_kb=200, available_kb=700)
    assert core.node_memory_bytes(mem) == 300 * 1024
    assert core.node_memory_with_page_cache(mem) == 800 * 1024


def test_system_usage_is_clamped_at_zero() -> None:
    assert core.system_usage((4.0, 1000), [(1.5, 300), (0.5, 200)]) == (2.0, 500)
    assert core.system_usage((1.0, 100), [(1.5, 300)]) == (0.0, 0)


# --- Sampler


def reading(
    at: float, busy: int, pods: dict[str, int] | None = None, *, containers: dict[str, int] | None = None
) -> core.NodeReading:
    mem = core.MemoryStat(active_anon=100, inactive_file=50)
    return core.NodeReading(
        at=at,
        clock_ticks_per_second=100,
        cpu_count=4,
        cpu=ticks(user=busy, idle=10_000),
        memory=core.MemInfo(total_kb=4000, free_kb=1000, available_kb=2000),
        pods=tuple(
            core.PodReading(
                uid=uid,
                kube_qos="Burstable",
                cgroup=core.CgroupReading(cpu_usage_ns=ns, memory=mem),
                containers=tuple(
                    core.ContainerReading(container_id=cid, cgroup=core.CgroupReading(cpu_usage_ns=c_ns, memory=mem))
                    for cid, c_ns in (containers or {}).items()
                ),
            )
            for uid, ns in (pods or {}).items()
        ),
    )


def test_sampler_skips_first_samples_and_subtracts_pods_for_system() -> None:
    sampler = core.Sampler()
    first = sampler.observe(reading(100.0, 1000, {UID: 0}, containers={CID: 0}))
    assert first.node is None and first.system is None and first.pods == ()
    second = sampler.observe(reading(101.0, 1150, {UID: 500_000_000, STATIC_UID: 7}, containers={CID: 200_000_000}))
    assert second.node == (101.0, 1.5, 2000 * 1024)
    (pod,) = second.pods  # STATIC_UID is new: no baseline
    assert pod.pod == PodRef(uid=UID, kube_qos="Burstable")
    assert pod.sample == (101.0, 0.5, 100) and pod.memory_with_page_cache == 150
    assert [(c.container_id, c.sample) for c in pod.containers] == [(CID, (101.0, 0.2, 100))]
    # system CPU subtracts sampled pods only; system memory subtracts every pod's memory.
    assert second.system is not None
    assert second.system[0] == 101.0 and second.system[1] == pytest.approx(1.0)
    assert second.system[2] == 2000 * 1024 - 200
    third = sampler.observe(reading(102.0, 1250, {STATIC_UID: 1_000_000_007}))
    assert [(p.pod.uid, p.sample[1]) for p in third.pods] == [(STATIC_UID, 1.0)]
    fourth = sampler.observe(reading(103.0, 1350, {UID: 900_000_000, STATIC_UID: 2_000_000_007}))
    assert [p.pod.uid for p in fourth.pods] == [STATIC_UID]  # UID was gone for a reading: its baseline is forgotten


def test_sampler_caps_node_cpu_at_cpu_count() -> None:
    sampler = core.Sampler()
    sampler.observe(reading(0.0, 0))
    tick = sampler.observe(reading(1.0, 450))  # 4.5 cores of ticks on a 4-CPU node: clock skew between reads
    assert tick.node is not None and tick.node[1] == 4.0


@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=2, max_size=20))
def test_sampler_never_reports_negative_cpu(counters: list[int]) -> None:
    sampler = core.Sampler()
    for i, ns in enumerate(counters):
        tick = sampler.observe(reading(float(i), 100 * i, {UID: ns}))
        assert all(p.sample[1] >= 0 for p in tick.pods)
        assert tick.system is None or tick.system[1] >= 0


# --- BatchBuilder


def make_tick(at: float, pods: list[core.PodSample] | None = None) -> core.Tick:
    return core.Tick(
        at=at, node=(at, 1.0, 10), node_memory_with_page_cache=20, system=(at, 0.5, 5), pods=tuple(pods or ())
    )


def pod_sample(uid: str, at: float, *, name: str = "", cid: str = "") -> core.PodSample:
    containers = (core.ContainerSample(container_id=cid, sample=(at, 0.1, 1), memory_with_page_cache=2),) if cid else ()
    return core.PodSample(
        pod=PodRef(uid=uid, name=name), sample=(at, 0.2, 3), memory_with_page_cache=4, containers=containers
    )


def test_window_start_is_aligned_to_wall_clock_multiples() -> None:
    assert window_start_of(1_700_000_009.999, 10) == 1_700_000_000
    assert window_start_of(1_700_000_010.0, 10) == 1_700_000_010
    assert window_start_of(125.0, 60) == 120


def test_batch_builder_closes_a_window_when_a_tick_passes_its_end() -> None:
    builder = BatchBuilder("node-a", interval=10)
    assert builder.add(make_tick(1001.0, [pod_sample(UID, 1001.0, name="old", cid=CID)])) is None
    assert builder.add(make_tick(1005.0, [pod_sample(STATIC_UID, 1005.0)])) is None
    assert builder.add(make_tick(1009.5, [pod_sample(UID, 1009.5, name="new")])) is None
    assert not builder.due(1009.99) and builder.due(1010.0)
    batch = builder.add(make_tick(1010.0), dropped_batches=2)
    assert batch is not None
    assert (batch.node, batch.window_start, batch.window_end, batch.sent_at) == ("node-a", 1000, 1010, 1010.0)
    assert batch.dropped_batches == 2
    assert [s[0] for s in batch.node_samples] == [1001.0, 1005.0, 1009.5]
    assert batch.memory_with_page_cache == [(1001.0, 20), (1005.0, 20), (1009.5, 20)]
    assert [p.uid for p in batch.pods] == sorted([UID, STATIC_UID])
    ref, samples = next((ref, samples) for ref, samples in wire.samples_by_pod(batch) if ref.uid == UID)
    assert ref.name == "new"  # the latest PodRef wins
    assert [s[0] for s in samples] == [1001.0, 1009.5]
    assert [(c.id, [s[0] for s in cs]) for c, cs in wire.containers_by_pod(batch)[UID]] == [(CID, [1001.0])]
    assert builder.window_start == 1010
    rest = builder.close(sent_at=1020.0)
    assert rest is not None and rest.window_start == 1010 and [s[0] for s in rest.node_samples] == [1010.0]
    assert builder.close(sent_at=1030.0) is None


def test_batch_builder_emits_pod_and_container_columns_grouped_in_pod_order() -> None:
    builder = BatchBuilder("node-a", interval=10)
    cids = {UID: CID, STATIC_UID: "f" * 64}
    times = {UID: [1001.0, 1003.0], STATIC_UID: [1001.0, 1002.0, 1003.0]}  # UID missed the reading at 1002
    for at in (1001.0, 1002.0, 1003.0):
        pods = [pod_sample(uid, at, cid=cids[uid]) for uid in (UID, STATIC_UID) if at in times[uid]]
        builder.add(make_tick(at, pods))
    batch = builder.close(sent_at=1010.0)
    assert batch is not None
    order = sorted([UID, STATIC_UID])
    index = [i for i, uid in enumerate(order) for _ in times[uid]]
    assert [p.uid for p in batch.pods] == order
    assert batch.pod_samples == PodSampleColumns.of(
        pod=index,
        t=[t for uid in order for t in times[uid]],
        cpu=[0.2] * 5,
        memory=[3] * 5,
        memory_with_page_cache=[4] * 5,
    )
    assert batch.containers == [ContainerRef(pod=i, id=cids[uid]) for i, uid in enumerate(order)]
    assert batch.container_samples.arrays().index.tolist() == index
    assert batch.container_samples.t == batch.pod_samples.t
    assert NODE_EVENT_DECODER.decode(encode_node_event(batch)) == batch


def test_batch_builder_skips_empty_windows_and_jumps_over_gaps() -> None:
    builder = BatchBuilder("node-a", interval=10)
    empty = core.Tick(at=5.0, node=None, node_memory_with_page_cache=0, system=None)
    assert builder.add(empty) is None
    assert builder.add(make_tick(47.0)) is None  # window [0,10) held nothing: no batch
    batch = builder.add(make_tick(61.0))
    assert batch is not None and (batch.window_start, batch.window_end) == (40, 50)


# --- Outbox


def test_outbox_drops_oldest_and_counts() -> None:
    box: Outbox[int] = Outbox(3)
    assert [box.push(i) for i in range(5)] == [0, 0, 0, 1, 1]
    assert box.dropped == 2 and len(box) == 3
    assert box.peek() == 2
    assert [box.pop() for _ in range(3)] == [2, 3, 4]
    assert box.peek() is None
    with pytest.raises(ValueError, match="at least 1"):
        Outbox(0)


@given(st.integers(min_value=1, max_value=20), st.lists(st.integers(), max_size=60))
def test_outbox_keeps_the_newest_items_in_order(bound: int, items: list[int]) -> None:
    box: Outbox[int] = Outbox(bound)
    for item in items:
        box.push(item)
    kept = [box.pop() for _ in range(len(box))]
    assert kept == items[-bound:] if items else kept == []
    assert box.dropped == max(len(items) - bound, 0)
