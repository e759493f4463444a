"""The agent's collector + core on generated /proc and cgroup trees (all four version × driver layouts), on this
machine's real /proc and cgroupfs, on a private subtree of the real cgroup v1 filesystem, and the AgentService
publish loop against a publisher that fails for a while and then recovers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from agent import collect, core
from agent.service import AgentService
from agent.settings import AgentSettings
from bus import api, subjects
from bus.errors import BusUnavailableError
from schemas.node import NodeMetricsReported, NodeStateReported
from tests.cgroup_tree import FakeCgroupTree, MiB, container_name, pod_rel

UID_G = "11111111-2222-3333-4444-555555555555"
UID_B = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
UID_E = "0123456789abcdef0123456789abcdef"  # static pod: config hash, no dashes
CID = {name: name[0] * 64 for name in ("a-app", "b-sidecar", "c-burst", "d-batch")}
LAYOUTS = [(1, "cgroupfs"), (1, "systemd"), (2, "cgroupfs"), (2, "systemd")]
TCK = collect.clock_ticks_per_second()


def build_tree(tmp_path: Path, version: int, driver: str, parent: str = "") -> FakeCgroupTree:
    tree = FakeCgroupTree(root=tmp_path, version=version, driver=driver, parent=parent)
    tree.add_pod(UID_G, "Guaranteed", inactive_anon=100 * MiB, active_anon=200 * MiB, active_file=50 * MiB)
    tree.add_container(UID_G, "Guaranteed", CID["a-app"], active_anon=150 * MiB, inactive_file=10 * MiB)
    tree.add_container(UID_G, "Guaranteed", CID["b-sidecar"], active_anon=40 * MiB)
    tree.add_pod(UID_B, "Burstable", active_anon=64 * MiB, unevictable=1 * MiB, inactive_file=300 * MiB)
    tree.add_container(UID_B, "Burstable", CID["c-burst"], active_anon=60 * MiB)
    tree.add_pod(UID_E, "BestEffort", active_anon=32 * MiB)
    tree.add_container(UID_E, "BestEffort", CID["d-batch"], active_anon=30 * MiB)
    tree.write()
    return tree


def settings_for(tree: FakeCgroupTree, **overrides: object) -> AgentSettings:
    fields: dict[str, object] = {
        "node_name": "node-a.example",
        "proc_root": str(tree.proc_root),
        "cgroup_root": str(tree.cgroup_root),
        "kubepods_parent": tree.parent,
    }
    fields.update(overrides)
    return AgentSettings(**fields)  # type: ignore[arg-type]


def advance(tree: FakeCgroupTree, seconds: float) -> None:
    """Node busy 2.5 cores (plus idle/iowait/steal that must not count); pods 0.5 / 1.0 / 0.25 cores."""
    p = tree.proc
    p.user += int(1.5 * TCK * seconds)
    p.system += int(0.5 * TCK * seconds)
    p.softirq += int(0.3 * TCK * seconds)
    p.irq += int(0.2 * TCK * seconds)
    p.idle += int(1.0 * TCK * seconds)
    p.iowait += int(0.3 * TCK * seconds)
    p.steal += int(0.2 * TCK * seconds)
    rates = {
        pod_rel(tree.driver, UID_G, "Guaranteed"): 0.5,
        pod_rel(tree.driver, UID_B, "Burstable"): 1.0,
        pod_rel(tree.driver, UID_E, "BestEffort"): 0.25,
    }
    for rel, cg in tree.cgroups.items():
        cg.cpu_ns += int(rates.get(rel, 0.2) * seconds * 1e9)
    tree.write()


@pytest.mark.parametrize(("version", "driver"), LAYOUTS)
def test_collector_and_sampler_on_generated_trees(tmp_path: Path, version: int, driver: str) -> None:
    tree = build_tree(tmp_path, version, driver, parent="kube-test/node1")
    collector = collect.Collector(settings_for(tree))
    sampler = core.Sampler()

    first = collector(1000.0)
    assert (first.cgroup_version, first.cgroup_driver, first.cpu_count) == (version, driver, 4)
    assert {(p.uid, p.kube_qos) for p in first.pods} == {
        (UID_G, "Guaranteed"),
        (UID_B, "Burstable"),
        (UID_E, "BestEffort"),
    }
    assert sampler.observe(first).node is None  # first reading: no CPU baseline yet

    advance(tree, 2.0)
    tick = sampler.observe(collector(1002.0))
    assert tick.node is not None and tick.system is not None
    assert tick.node[1] == pytest.approx(2.5)
    assert tick.node[2] == 6 * 1024 * MiB  # MemTotal 16 GiB − MemAvailable 10 GiB
    assert tick.node_memory_with_page_cache == 8 * 1024 * MiB
    pods = {ps.pod.uid: ps for ps in tick.pods}
    assert {uid: pods[uid].sample[1] for uid in pods} == pytest.approx({UID_G: 0.5, UID_B: 1.0, UID_E: 0.25})
    assert pods[UID_G].sample[2] == 300 * MiB  # anon only, page cache excluded
    assert pods[UID_G].memory_with_page_cache == 350 * MiB
    assert pods[UID_B].sample[2] == 65 * MiB
    assert pods[UID_B].memory_with_page_cache == 365 * MiB
    containers = {c.container_id: c for c in pods[UID_G].containers}
    assert set(containers) == {CID["a-app"], CID["b-sidecar"]}
    assert containers[CID["a-app"]].sample[1] == pytest.approx(0.2)
    assert containers[CID["a-app"]].sample[2] == 150 * MiB
    assert containers[CID["a-app"]].memory_with_page_cache == 160 * MiB
    assert tick.system[1] == pytest.approx(2.5 - 1.75)
    assert tick.system[2] == 6 * 1024 * MiB - (300 + 65 + 32) * MiB


@pytest.mark.parametrize(("version", "driver"), LAYOUTS)
def test_foreign_names_symlinks_and_vanished_cgroups_are_skipped(tmp_path: Path, version: int, driver: str) -> None:
    tree = build_tree(tmp_path, version, driver)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpuacct.usage").write_text("999999999999\n")
    for hier in tree.hierarchies():
        base = hier / ("kubepods" if driver == "cgroupfs" else "kubepods.slice")
        (base / "not-a-pod").mkdir()
        (base / ("podzzzz" if driver == "cgroupfs" else "kubepods-podzzzz.slice")).mkdir()
        evil_uid = "99999999-9999-9999-9999-999999999999"
        (base / pod_rel(driver, evil_uid, "Guaranteed").split("/", 1)[1]).symlink_to(outside)
        pod_dir = hier / pod_rel(driver, UID_G, "Guaranteed")
        (pod_dir / "crio-conmon-abcdef0123456789.scope").mkdir()
        (pod_dir / "cgroup.procs").write_text("")
    # The burstable container loses its counters file mid-read, as when a container is torn down.
    c_rel = f"{pod_rel(driver, UID_B, 'Burstable')}/{container_name(driver, CID['c-burst'])}"
    hier = tree.cgroup_root if version == 2 else tree.cgroup_root / "cpuacct"
    (hier / c_rel / ("cpu.stat" if version == 2 else "cpuacct.usage")).unlink()

    reading = collect.Collector(settings_for(tree))(10.0)
    assert sorted(p.uid for p in reading.pods) == sorted([UID_G, UID_B, UID_E])
    by_uid = {p.uid: p for p in reading.pods}
    assert [c.container_id for c in by_uid[UID_G].containers] == [CID["a-app"], CID["b-sidecar"]]
    assert by_uid[UID_B].containers == ()


def test_removed_pod_disappears_and_returning_pod_restarts_its_baseline(tmp_path: Path) -> None:
    tree = build_tree(tmp_path, 2, "systemd")
    collector = collect.Collector(settings_for(tree))
    sampler = core.Sampler()
    sampler.observe(collector(0.0))
    tree.remove(pod_rel("systemd", UID_E, "BestEffort"))
    advance(tree, 1.0)
    tick = sampler.observe(collector(1.0))
    assert sorted(ps.pod.uid for ps in tick.pods) == sorted([UID_G, UID_B])
    tree.add_pod(UID_E, "BestEffort", cpu_ns=10**9, active_anon=MiB)
    advance(tree, 1.0)
    tick = sampler.observe(collector(2.0))
    assert UID_E not in {ps.pod.uid for ps in tick.pods}  # a re-created cgroup starts a new baseline
    advance(tree, 1.0)
    tick = sampler.observe(collector(3.0))
    assert {ps.pod.uid: ps.sample[1] for ps in tick.pods}[UID_E] == pytest.approx(0.25)


def test_layout_detection_auto_and_missing_kubepods(tmp_path: Path) -> None:
    tree = FakeCgroupTree(root=tmp_path, version=2, driver="systemd")
    tree.write()
    layout = collect.detect_layout(settings_for(tree))
    assert (layout.version, layout.driver, layout.cpu_base) == (2, "", None)
    hybrid = tmp_path / "hybrid"
    (hybrid / "cpuacct").mkdir(parents=True)
    (hybrid / "cgroup.controllers").write_text("")
    assert collect.detect_version(settings_for(tree, cgroup_root=str(hybrid))) == 1


def test_kubepods_parent_escaping_the_root_through_a_symlink_is_not_read(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "elsewhere", 2, "cgroupfs")
    root = tmp_path / "root"
    root.mkdir()
    (root / "cgroup.controllers").write_text("")
    (root / "escape").symlink_to(tree.cgroup_root)
    layout = collect.detect_layout(settings_for(tree, cgroup_root=str(root), kubepods_parent="escape"))
    assert layout.cpu_base is None


def test_real_proc_and_cgroupfs_of_this_machine() -> None:
    settings = AgentSettings(node_name="this-host")
    collector = collect.Collector(settings)
    sampler = core.Sampler()
    sampler.observe(collector(time.time()))
    time.sleep(0.3)
    tick = sampler.observe(collector(time.time()))
    assert tick.node is not None
    total = collect.read_meminfo("/proc").total_kb * 1024
    assert 0 <= tick.node[1] <= (os.cpu_count() or 1)
    assert 0 < tick.node[2] <= total
    assert tick.system is not None and tick.system[2] <= tick.node[2]


# --- the real cgroup v1 filesystem

_BUSY_CHILD = """
import sys
sys.stdin.readline()          # wait until moved into the test cgroup, so the memory is charged there
block = bytearray(64 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
print("ready", flush=True)
while True:
    pass
"""


def _writable_v1_root() -> Path | None:
    root = Path("/sys/fs/cgroup")
    needed = [root / h for h in ("cpu", "cpuacct", "memory")]
    if (root / "cgroup.controllers").exists() or not all(p.is_dir() and os.access(p, os.W_OK) for p in needed):
        return None
    return root


@pytest.mark.cgroup
def test_real_cgroup_v1_subtree_measures_a_busy_process(tmp_path: Path) -> None:
    root = _writable_v1_root()
    if root is None:
        pytest.skip("needs a writable cgroup v1 filesystem (cpu, cpuacct, memory) at /sys/fs/cgroup")
    parent = f"koordbus-test-{uuid.uuid4().hex[:12]}"
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    container_rel = f"{pod_rel('cgroupfs', uid, 'BestEffort')}/{cid}"
    dirs = [root / h / parent / container_rel for h in ("cpu", "cpuacct", "memory")]
    child = subprocess.Popen([sys.executable, "-c", _BUSY_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        try:
            for d in dirs:
                d.mkdir(parents=True)
                (d / "cgroup.procs").write_text(str(child.pid))
        except OSError as e:
            pytest.skip(f"cannot create or join a cgroup under {root}: {e}")
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"ready\n"
        settings = AgentSettings(node_name="this-host", cgroup_driver="cgroupfs", kubepods_parent=parent)
        collector, sampler = collect.Collector(settings), core.Sampler()
        sampler.observe(collector(time.time()))
        time.sleep(1.5)
        tick = sampler.observe(collector(time.time()))
        (pod,) = tick.pods
        assert (pod.pod.uid, pod.pod.kube_qos) == (uid, "BestEffort")
        assert pod.sample[1] > 0.3
        assert pod.sample[2] >= 60 * MiB
        (container,) = pod.containers
        assert container.container_id == cid and container.sample[1] > 0.3
    finally:
        child.kill()
        child.communicate()  # reaps the child and closes its pipes
        _remove_subtree([root / h / parent for h in ("cpu", "cpuacct", "memory")])


def _remove_subtree(tops: list[Path]) -> None:
    """rmdir bottom-up (cgroup directories cannot be removed recursively); retry briefly while the kernel settles."""
    for top in tops:
        if not top.exists():
            continue
        for attempt in range(50):
            try:
                for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                    os.rmdir(dirpath)
                break
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)


# --- the service loop with a failing bus


class FlakyPublisher:
    """Stores what it is sent; raises BusUnavailableError (or times out) while `down` is set."""

    def __init__(self) -> None:
        self.down = False
        self.hang = False
        self.sent: list[tuple[str, bytes, str]] = []
        self.attempts = 0

    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> object:
        self.attempts += 1
        if self.hang:
            await asyncio.sleep(3600)
        if self.down:
            raise BusUnavailableError("connection refused")
        self.sent.append((subject, data, msg_id))
        return None


class FakeTime:
    """Clock and sleep for AgentService: sleeping advances the clock and the generated node's counters."""

    def __init__(self, tree: FakeCgroupTree, start: float) -> None:
        self.now = start
        self.tree = tree

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        advance(self.tree, seconds)
        self.now += seconds


async def test_service_buffers_drops_oldest_and_resends_in_order(tmp_path: Path) -> None:
    tree = build_tree(tmp_path, 1, "cgroupfs")
    fake = FakeTime(tree, start=1_700_000_000.0)
    publisher = FlakyPublisher()
    settings = settings_for(tree, publish_interval=10.0, max_buffered_batches=3, publish_timeout=0.05)
    service = AgentService(settings, publisher, clock=fake.clock, sleep=fake.sleep)

    async def run_for(seconds: float) -> None:
        end = fake.now + seconds
        while fake.now < end:
            await service.collect_once()
            await fake.sleep(1.0)

    await run_for(25)  # bus up: the state and windows [0,10), [10,20) sent
    metrics = [m for m in publisher.sent if m[0] == subjects.node_metrics("node-a.example")]
    assert len(metrics) == 2 and service.stats.states_sent == 1
    publisher.down = True
    await run_for(60)  # six windows close while the bus is away; the outbox keeps 3
    assert service.stats.dropped_batches == 3
    assert service.stats.buffered_batches == 3
    assert not service.stats.bus_available
    publisher.down = False
    await run_for(11)
    decoded = [
        msgspec.msgpack.decode(d, type=NodeMetricsReported) for s, d, _ in publisher.sent if s.endswith(".metrics")
    ]
    starts = [b.window_start for b in decoded]
    assert starts == sorted(starts)
    assert starts[1] - starts[0] == 10 and starts[2] - starts[1] == 10 + 3 * 10  # windows 3–5 were dropped
    # Each drop is reported by the next batch built after it: [50,60) dropped [20,30) when it was pushed, …
    assert [b.dropped_batches for b in decoded] == [0, 0, 0, 1, 1, 1]
    assert service.stats.buffered_batches == 0 and service.stats.bus_available
    for (_s, _d, mid), batch in zip([m for m in publisher.sent if m[0].endswith(".metrics")], decoded, strict=True):
        assert mid == api.msg_id("node-a.example", "metrics", batch.window_start)
    first = decoded[0]
    assert [p.uid for p in first.pods] == sorted([UID_G, UID_B, UID_E])
    assert sorted(set(first.pod_samples.arrays().index.tolist())) == [0, 1, 2]  # every listed pod has samples
    assert all(first.window_start <= s[0] < first.window_end for s in first.node_samples)
    assert [s[0] for s in first.node_samples] == sorted(s[0] for s in first.node_samples)


async def test_service_treats_a_hanging_publish_as_unavailable_and_resends_state_on_pod_change(tmp_path: Path) -> None:
    tree = build_tree(tmp_path, 2, "cgroupfs")
    fake = FakeTime(tree, start=1_700_000_000.0)
    publisher = FlakyPublisher()
    settings = settings_for(tree, publish_timeout=0.01, state_interval=300.0)
    service = AgentService(settings, publisher, clock=fake.clock, sleep=fake.sleep)
    publisher.hang = True
    await service.collect_once()
    assert service.stats.publish_failures == 1 and service.stats.states_sent == 0
    publisher.hang = False
    await service.collect_once()
    await service.collect_once()
    states = [msgspec.msgpack.decode(d, type=NodeStateReported) for s, d, _ in publisher.sent if s.endswith(".state")]
    assert len(states) == 1 and states[0].cgroup_version == 2 and len(states[0].pods) == 3
    tree.remove(pod_rel("cgroupfs", UID_E, "BestEffort"))
    await service.collect_once()
    states = [msgspec.msgpack.decode(d, type=NodeStateReported) for s, d, _ in publisher.sent if s.endswith(".state")]
    assert len(states) == 2 and {p.uid for p in states[1].pods} == {UID_G, UID_B}
    fake.now += 301
    await service.collect_once()
    assert service.stats.states_sent == 3


async def test_run_loop_stops_and_samples_on_the_collect_interval(tmp_path: Path) -> None:
    tree = build_tree(tmp_path, 1, "systemd")
    fake = FakeTime(tree, start=1_700_000_005.0)
    publisher = FlakyPublisher()

    async def sleep_then_maybe_stop(seconds: float) -> None:
        await fake.sleep(seconds)
        if fake.now >= 1_700_000_031.0:
            await service.stop()

    service = AgentService(settings_for(tree), publisher, clock=fake.clock, sleep=sleep_then_maybe_stop)
    await service.run()
    batches = [
        msgspec.msgpack.decode(d, type=NodeMetricsReported) for s, d, _ in publisher.sent if s.endswith(".metrics")
    ]
    assert [b.window_start for b in batches] == [1_700_000_000.0, 1_700_000_010.0, 1_700_000_020.0]
    assert len(batches[0].node_samples) == 4  # t=6..9: the first reading at t=5 has no baseline
    assert len(batches[1].node_samples) == 10


def test_open_files_reread_changes_and_close_what_was_not_read(tmp_path: Path) -> None:
    files = collect.OpenFiles(max_open=2)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_text("1\n")
    b.write_text("x" * 70_000)  # more than one pread
    c.write_text("3\n")
    assert files.read(str(a)) == b"1\n"
    a.write_text("22\n")  # rewritten in place, as a cgroup file's content changes
    assert files.read(str(a)) == b"22\n"
    assert files.read(str(b)) == b"x" * 70_000
    assert files.read(str(c)) == b"3\n"  # past max_open: read with open-read-close, not kept
    assert len(files._fds) == 2
    files.sweep()
    assert files.read(str(a)) == b"22\n"
    files.sweep()  # b was not read in this collection: closed
    assert set(files._fds) == {str(a)}
    # A read that fails (a removed cgroup's descriptor answers ENODEV; here the descriptor is closed under it) opens
    # the path again once: a cgroup created again reads fresh, a path that is no file any more fails.
    os.close(files._fds[str(a)])
    assert files.read(str(a)) == b"22\n"
    os.close(files._fds[str(a)])
    a.unlink()
    a.mkdir()
    with pytest.raises(OSError):
        files.read(str(a))
    assert files._fds == {}
    files.close()


def test_open_files_budget_follows_the_descriptor_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"soft": 1024, "hard": 1024}
    monkeypatch.setattr(collect.resource, "getrlimit", lambda _: (limits["soft"], limits["hard"]))

    def setrlimit(_: int, value: tuple[int, int]) -> None:
        limits["soft"] = value[0]

    monkeypatch.setattr(collect.resource, "setrlimit", setrlimit)
    assert collect.OpenFiles().max_open == 1024 // 2 - 64  # a low hard limit: half of it, never all
    limits["hard"] = 1_000_000
    assert collect.OpenFiles().max_open == 4096 and limits["soft"] == 65536  # raised towards the hard limit


def test_container_directories_are_listed_every_few_collections_and_at_once_after_a_stop(tmp_path: Path) -> None:
    tree = build_tree(tmp_path, 1, "cgroupfs")
    layout = collect.detect_layout(settings_for(tree))
    listings = collect.ContainerListings(every=3)

    def containers_of(uid: str) -> set[str]:
        listings.begin()
        pods = {p.uid: p for p in collect.read_pods(layout, listings=listings)}
        return {c.container_id for c in pods[uid].containers}

    assert containers_of(UID_B) == {CID["c-burst"]}
    new = "e" * 64
    tree.add_container(UID_B, "Burstable", new, active_anon=1 * MiB)
    tree.write()
    assert containers_of(UID_B) == {CID["c-burst"]}  # listed one collection ago: not seen yet
    assert containers_of(UID_B) == {CID["c-burst"]}
    assert containers_of(UID_B) == {CID["c-burst"], new}  # the third collection lists again
    tree.remove(f"{pod_rel('cgroupfs', UID_B, 'Burstable')}/{new}")
    tree.write()
    assert containers_of(UID_B) == {CID["c-burst"]}  # a container that cannot be read is not reported …
    tree.add_container(UID_B, "Burstable", "f" * 64, active_anon=1 * MiB)
    tree.write()
    assert containers_of(UID_B) == {CID["c-burst"], "f" * 64}  # … and its pod is listed again at once
