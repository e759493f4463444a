"""The agent measures its NodeSLO's host applications (issue 22, point 3) on generated cgroup trees of all four
version × driver layouts: each application's cgroup found by Koordinator's rules, sampled like a pod, subtracted
from the system usage, carried in the batch; directories escaping the cgroup root and unreadable cgroups are
skipped and logged once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent import collect, core
from agent.service import AgentService
from agent.slo_watch import SloSource, refresh_forever
from bus.api import Delivery
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported
from schemas.qos import NodeSloRendered
from tests.cgroup_tree import FakeCgroup, FakeCgroupTree, MiB
from tests.integration.test_agent_collect import LAYOUTS, FakeTime, FlakyPublisher, advance, build_tree, settings_for

APPS: list[dict[str, Any]] = [
    {"name": "nginx", "priority": "koord-prod", "qos": "LS"},  # no cgroupPath: host-latency-sensitive/nginx
    {"name": "sshd", "cgroupPath": {"base": "CgroupRoot", "parentDir": "system.slice", "relativePath": "sshd.service"}},
    {
        "name": "backup",
        "priority": "koord-batch",
        "qos": "BE",
        "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "backup"},
    },
]
RATES = {"nginx": 1.0, "sshd": 0.1, "backup": 0.2}  # cores; the kubepods one is advanced with the pods (0.2)


def with_host_apps(tree: FakeCgroupTree) -> FakeCgroupTree:
    tree.add_host_cgroup("host-latency-sensitive/nginx", active_anon=400 * MiB, inactive_file=100 * MiB)
    tree.add_host_cgroup("system.slice/sshd.service", active_anon=8 * MiB, extra_usage=MiB)
    tree.cgroups[f"{tree.kubepods_rel('BestEffort')}/backup"] = FakeCgroup(active_anon=64 * MiB)
    tree.write()
    return tree


def advance_all(tree: FakeCgroupTree, seconds: float) -> None:
    tree.host_cgroups["host-latency-sensitive/nginx"].cpu_ns += int(RATES["nginx"] * seconds * 1e9)
    tree.host_cgroups["system.slice/sshd.service"].cpu_ns += int(RATES["sshd"] * seconds * 1e9)
    advance(tree, seconds)  # writes the tree


@pytest.mark.parametrize(("version", "driver"), LAYOUTS)
def test_host_applications_on_generated_trees(tmp_path: Path, version: int, driver: str) -> None:
    tree = with_host_apps(build_tree(tmp_path, version, driver, parent="kube-test/node1"))
    collector = collect.Collector(settings_for(tree), host_applications=lambda: APPS)
    sampler = core.Sampler()
    first = collector(1000.0)
    assert {(a.name, a.cgroup_dir) for a in first.host_apps} == {
        ("nginx", "host-latency-sensitive/nginx"),
        ("sshd", "system.slice/sshd.service"),
        ("backup", f"kube-test/node1/{tree.kubepods_rel('BestEffort')}/backup"),
    }
    assert sampler.observe(first).host_apps == ()
    advance_all(tree, 2.0)
    tick = sampler.observe(collector(1002.0))
    apps = {a.name: a for a in tick.host_apps}
    assert {name: a.sample[1] for name, a in apps.items()} == pytest.approx(RATES)
    assert apps["nginx"].sample[2] == 400 * MiB  # anon only, as a pod's
    assert apps["nginx"].memory_with_page_cache == 500 * MiB  # memory.usage_in_bytes / memory.current
    assert apps["sshd"].memory_with_page_cache == 9 * MiB
    assert (apps["nginx"].priority, apps["nginx"].qos, apps["backup"].priority) == ("koord-prod", "LS", "koord-batch")
    assert tick.system is not None
    # node 2.5 cores − pods 1.75 − host apps 1.3 < 0: clamped; memory: node − pods − host apps (anon)
    assert tick.system[1] == 0.0
    assert tick.system[2] == 6 * 1024 * MiB - (300 + 65 + 32) * MiB - (400 + 8 + 64) * MiB


def test_a_cgroup_escaping_the_root_and_a_missing_one_are_skipped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = with_host_apps(build_tree(tmp_path / "node", 2, "systemd"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.stat").write_text("usage_usec 999999999\n")
    (outside / "memory.stat").write_text("active_anon 1\n")
    (outside / "memory.current").write_text("1\n")
    (tree.cgroup_root / "evil").symlink_to(outside)
    apps = [*APPS, {"name": "evil", "cgroupPath": {"relativePath": "evil"}}, {"name": "gone"}, {"name": "../x"}]
    collector = collect.Collector(settings_for(tree), host_applications=lambda: apps)
    with caplog.at_level(logging.INFO, logger="agent.collect"):
        for at in (1.0, 2.0, 3.0):
            reading = collector(at)
            assert sorted(a.name for a in reading.host_apps) == ["backup", "nginx", "sshd"]
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "host application skipped" in m] == [
        "node node-a.example: host application skipped: hostApplications[5] '../x': invalid name '../x': must be "
        "letters, digits, '-', '_' and '.', beginning and ending with a letter or digit"
    ]
    evil = [m for m in messages if "evil not measured" in m]
    assert len(evil) == 1 and "resolves outside the cgroup root" in evil[0]
    gone = [m for m in messages if "gone not measured" in m]
    assert len(gone) == 1 and "its cgroup gone cannot be read" in gone[0]
    tree.add_host_cgroup("gone", active_anon=MiB)
    tree.write()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agent.collect"):
        assert "gone" in {a.name for a in collector(4.0).host_apps}
    assert [r.getMessage() for r in caplog.records] == ["node node-a.example: host application gone is measured again"]


def test_kubepods_based_applications_wait_for_kubepods(tmp_path: Path) -> None:
    tree = FakeCgroupTree(root=tmp_path, version=1, driver="cgroupfs")
    tree.add_host_cgroup("host-latency-sensitive/nginx", active_anon=MiB)
    tree.write()
    reading = collect.Collector(settings_for(tree), host_applications=lambda: APPS)(1.0)
    assert [a.name for a in reading.host_apps] == ["nginx"]  # sshd has no cgroup, backup no kubepods


async def test_the_service_publishes_the_nodeslo_host_applications_and_follows_its_changes(tmp_path: Path) -> None:
    tree = with_host_apps(build_tree(tmp_path, 2, "cgroupfs"))
    fake = FakeTime(tree, start=1_700_000_000.0)
    publisher = FlakyPublisher()
    spec: dict[str, Any] = {"hostApplications": APPS}

    async def sleep(seconds: float) -> None:
        tree.host_cgroups["host-latency-sensitive/nginx"].cpu_ns += int(seconds * 1e9)
        await fake.sleep(seconds)

    service = AgentService(
        settings_for(tree, publish_interval=10.0),
        publisher,
        clock=fake.clock,
        sleep=sleep,
        host_applications=lambda: spec.get("hostApplications"),
    )
    for _ in range(10):  # t = 0 … 9: the window [0, 10)
        await service.collect_once()
        await sleep(1.0)
    spec = {}  # the NodeSLO drops its host applications
    for _ in range(11):  # t = 10 … 20: the window [10, 20), closed at 20
        await service.collect_once()
        await sleep(1.0)
    batches = [NODE_EVENT_DECODER.decode(d) for s, d, _ in publisher.sent if s.endswith(".metrics")]
    assert all(isinstance(b, NodeMetricsReported) for b in batches) and len(batches) == 2
    first, second = (b for b in batches if isinstance(b, NodeMetricsReported))
    apps = {a.name: a for a in first.host_applications}
    assert sorted(apps) == ["backup", "nginx", "sshd"]
    assert len(apps["nginx"].samples) == 9 and all(s[1] == pytest.approx(1.0) for s in apps["nginx"].samples)
    assert apps["nginx"].memory_with_page_cache == [500 * MiB] * 9
    assert (apps["backup"].priority, apps["backup"].qos) == ("koord-batch", "BE")
    assert second.host_applications == [] and len(second.node_samples) == 10


class NodeSloKey:
    """This node's KOORD_SLO key as the agent reads it (a direct get of the last value)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.seq = 0
        self.set(spec)

    def set(self, spec: dict[str, Any]) -> None:
        self.seq += 1
        self.data = msgspec.json.encode(NodeSloRendered(node="node-a.example", spec=spec, rendered_at=1.0))

    async def last_on_subject(self, stream: str, subject: str, *, direct: bool = False) -> Delivery | None:
        return Delivery(
            subject=subject, data=self.data, headers={}, stream_seq=self.seq, num_delivered=1, published_at=1.0
        )


async def test_with_the_qos_loops_off_the_nodeslo_is_still_read_for_its_host_applications(tmp_path: Path) -> None:
    """koordbus agent --qos-mode off: SloSource kept current by refresh_forever, read by the collector."""
    tree = with_host_apps(build_tree(tmp_path, 1, "systemd"))
    key = NodeSloKey({"hostApplications": APPS[:1]})
    source = SloSource(key, "node-a.example", state_dir="", now=0.0)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await refresh_forever(source, interval=5.0, clock=lambda: 1.0, sleep=sleep)
    assert sleeps == [5.0, 5.0]
    collector = collect.Collector(
        settings_for(tree),
        host_applications=lambda: None if source.spec is None else source.spec.get("hostApplications"),
    )
    assert [a.name for a in collector(1.0).host_apps] == ["nginx"]
    key.set({"hostApplications": APPS})
    await source.refresh(2.0)
    assert sorted(a.name for a in collector(2.0).host_apps) == ["backup", "nginx", "sshd"]
