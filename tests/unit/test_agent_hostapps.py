"""The agent's host applications (issue 22, point 3): NodeSLO entries checked where they enter (agent/hostapps.py),
their cgroup directories by Koordinator's rules, the Sampler's samples and system usage net of them (spec §1.4), and
the BatchBuilder's host_applications."""

from __future__ import annotations

from typing import Any

import pytest

from agent import core, hostapps
from agent.batch import BatchBuilder
from schemas.node import MAX_HOST_APPLICATIONS, NODE_EVENT_DECODER, HostApplicationSamples, encode_node_event

# --- checking the NodeSLO's entries


def test_entries_without_a_cgroup_path_take_koordinators_default_directories() -> None:
    apps, refused = hostapps.parse_host_applications(
        [
            {"name": "nginx", "priority": "koord-prod", "qos": "LS"},
            {"name": "etcd", "qos": "LSR"},
            {"name": "backup", "priority": "koord-batch", "qos": "BE", "strategy": {}},
            {"name": "sshd"},
            {"name": "agent", "qos": "SYSTEM"},
        ]
    )
    assert refused == []
    assert [(a.name, a.priority, a.qos, a.base, a.path) for a in apps] == [
        ("nginx", "koord-prod", "LS", hostapps.ROOT, "host-latency-sensitive/nginx"),
        ("etcd", "", "LSR", hostapps.ROOT, "host-latency-sensitive/etcd"),
        ("backup", "koord-batch", "BE", hostapps.ROOT, "host-best-effort/backup"),
        ("sshd", "", "", hostapps.ROOT, "sshd"),
        ("agent", "", "SYSTEM", hostapps.ROOT, "agent"),
    ]


def test_cgroup_paths_of_every_base() -> None:
    entries = [
        {"name": "a", "cgroupPath": {"base": "CgroupRoot", "parentDir": "host-ls/", "relativePath": "nginx"}},
        {"name": "b", "cgroupPath": {"relativePath": "system.slice/sshd.service"}},
        {"name": "c", "cgroupPath": {"base": "Kubepods", "relativePath": "host-app"}},
        {"name": "d", "cgroupPath": {"base": "KubepodsBurstable", "parentDir": "extra"}},
        {"name": "e", "cgroupPath": {"base": "KubepodsBesteffort", "parentDir": "p", "relativePath": "q"}},
    ]
    apps, refused = hostapps.parse_host_applications(entries)
    assert refused == []
    dirs = {
        driver: [hostapps.cgroup_dir(app, driver=driver, kubepods_parent="") for app in apps]
        for driver in ("cgroupfs", "systemd")
    }
    assert dirs["cgroupfs"] == [
        "host-ls/nginx",
        "system.slice/sshd.service",
        "kubepods/host-app",
        "kubepods/burstable/extra",
        "kubepods/besteffort/p/q",
    ]
    assert dirs["systemd"][2:] == [
        "kubepods.slice/host-app",
        "kubepods.slice/kubepods-burstable.slice/extra",
        "kubepods.slice/kubepods-besteffort.slice/p/q",
    ]
    assert (
        hostapps.cgroup_dir(apps[2], driver="cgroupfs", kubepods_parent="kube-test/n1")
        == "kube-test/n1/kubepods/host-app"
    )
    assert hostapps.cgroup_dir(apps[0], driver="", kubepods_parent="") == "host-ls/nginx"  # the root needs no kubelet
    assert hostapps.cgroup_dir(apps[2], driver="", kubepods_parent="") is None  # kubepods not found yet


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("nginx", "hostApplications[0]: the entry is a str, not an object"),
        ({"qos": "LS"}, "hostApplications[0]: name is missing"),
        ({"name": 7}, "hostApplications[0]: name is not a string"),
        ({"name": ""}, "hostApplications[0] '': invalid name '': must not be empty"),
        ({"name": ".."}, "hostApplications[0] '..': invalid name '..': must be letters, digits"),
        ({"name": "a/../../etc"}, "invalid name 'a/../../etc'"),
        ({"name": "n" * 129}, "is 129 characters long; at most 128"),
        ({"name": "nginx\n"}, "invalid name 'nginx\\n'"),
        ({"name": "x", "priority": "koord-root"}, "priority 'koord-root' is none of Koordinator's"),
        ({"name": "x", "qos": 3}, "qos int '3' is none of Koordinator's"),
        ({"name": "x", "cgroupPath": "/sys/fs/cgroup/x"}, "cgroupPath is a str, not an object"),
        ({"name": "x", "cgroupPath": {"base": "Host"}}, "cgroupPath.base 'Host' is none of CgroupRoot, Kubepods"),
        ({"name": "x", "cgroupPath": {"relativePath": "/etc"}}, "cgroupPath.relativePath '/etc' must be a relative"),
        ({"name": "x", "cgroupPath": {"parentDir": "../.."}}, "cgroupPath.parentDir '../..' must be a relative path"),
        ({"name": "x", "cgroupPath": {"parentDir": "a/../b"}}, "cgroupPath.parentDir 'a/../b' must be"),
        ({"name": "x", "cgroupPath": {"parentDir": "a//b"}}, "cgroupPath.parentDir 'a//b' must be"),
        ({"name": "x", "cgroupPath": {"relativePath": "a b"}}, "cgroupPath.relativePath 'a b' must be"),
        ({"name": "x", "cgroupPath": {"relativePath": ["a"]}}, "cgroupPath.relativePath list \"['a']\" is not a"),
        ({"name": "x", "cgroupPath": {"relativePath": "p" * 256}}, "has a part longer than 255 characters"),
        ({"name": "x", "cgroupPath": {"relativePath": "a/" * 600}}, "is 1200 characters long; at most 1024"),
        ({"name": "x", "cgroupPath": {"base": "Kubepods"}}, "cgroupPath names no directory below its base"),
        ({"name": "x", "cgroupPath": {}}, "cgroupPath names no directory below its base"),
    ],
)
def test_hostile_entries_are_skipped_with_a_reason(entry: Any, reason: str) -> None:
    apps, refused = hostapps.parse_host_applications([entry, {"name": "good"}])
    assert [app.name for app in apps] == ["good"]  # the others are measured all the same
    assert len(refused) == 1 and reason in refused[0], refused


def test_duplicates_and_entries_past_the_bound_are_skipped() -> None:
    apps, refused = hostapps.parse_host_applications([{"name": "a"}, {"name": "b"}, {"name": "a", "qos": "BE"}])
    assert [(a.name, a.qos) for a in apps] == [("a", ""), ("b", "")]
    assert refused == ["hostApplications[2] 'a': the name is taken by an earlier entry"]
    many = [{"name": f"app-{i}"} for i in range(MAX_HOST_APPLICATIONS + 10)]
    apps, refused = hostapps.parse_host_applications(many)
    assert len(apps) == MAX_HOST_APPLICATIONS
    assert refused == ["hostApplications[64:]: 10 entries past the first 64 are not measured"]


@pytest.mark.parametrize("raw", [{"name": "x"}, "x", 3])
def test_a_host_applications_value_that_is_no_list_measures_nothing(raw: object) -> None:
    apps, refused = hostapps.parse_host_applications(raw)
    assert apps == () and len(refused) == 1 and "not a list" in refused[0]
    assert hostapps.parse_host_applications(None) == ((), [])


# --- Sampler: samples and system usage


def _cgroup(ns: int, anon: int) -> core.CgroupReading:
    return core.CgroupReading(cpu_usage_ns=ns, memory=core.MemoryStat(active_anon=anon, inactive_file=1000))


def _reading(at: float, busy: int, apps: dict[str, tuple[int, int]], *, pod_ns: int | None = None) -> core.NodeReading:
    pods = ()
    if pod_ns is not None:
        pods = (
            core.PodReading(
                uid="0e1f2a3b-4c5d-6e7f-8091-a2b3c4d5e6f7", kube_qos="Burstable", cgroup=_cgroup(pod_ns, 300)
            ),
        )
    return core.NodeReading(
        at=at,
        clock_ticks_per_second=100,
        cpu_count=8,
        cpu=core.CpuTicks(user=busy, nice=0, system=0, idle=10_000),
        memory=core.MemInfo(total_kb=4000, free_kb=1000, available_kb=2000),
        pods=pods,
        host_apps=tuple(
            core.HostAppReading(
                name=name,
                priority="koord-prod",
                qos="LS",
                cgroup_dir=f"host-latency-sensitive/{name}",
                cgroup=_cgroup(ns, anon),
                memory_usage=anon + 5000,
            )
            for name, (ns, anon) in apps.items()
        ),
    )


def test_host_applications_are_sampled_like_pods_and_subtracted_from_system_usage() -> None:
    sampler = core.Sampler()
    first = sampler.observe(_reading(100.0, 1000, {"nginx": (0, 100)}, pod_ns=0))
    assert first.host_apps == ()  # no previous counter
    second = sampler.observe(
        _reading(101.0, 1300, {"nginx": (1_000_000_000, 200), "sshd": (5, 50)}, pod_ns=500_000_000)
    )
    (nginx,) = second.host_apps  # sshd is new: no CPU sample yet
    assert (nginx.name, nginx.priority, nginx.qos) == ("nginx", "koord-prod", "LS")
    assert nginx.sample == (101.0, 1.0, 200) and nginx.memory_with_page_cache == 5200
    assert second.node == (101.0, 3.0, 2000 * 1024)
    # system = node − Σ pods − Σ host apps: CPU of those sampled, memory (without page cache) of every one read
    assert second.system is not None
    assert second.system[1] == pytest.approx(3.0 - 0.5 - 1.0)
    assert second.system[2] == 2000 * 1024 - 300 - 200 - 50
    third = sampler.observe(_reading(102.0, 1400, {"sshd": (250_000_005, 50)}))
    assert [(a.name, a.sample[1]) for a in third.host_apps] == [("sshd", 0.25)]
    fourth = sampler.observe(_reading(103.0, 1500, {"nginx": (3_000_000_000, 200), "sshd": (500_000_005, 50)}))
    assert [a.name for a in fourth.host_apps] == ["sshd"]  # nginx was unreadable for a reading: baseline forgotten


def test_an_application_moved_to_another_cgroup_starts_afresh() -> None:
    sampler = core.Sampler()
    sampler.observe(_reading(0.0, 0, {"nginx": (10_000_000_000, 1)}))
    moved = msgspec_replace_dir(_reading(1.0, 100, {"nginx": (20_000_000_000, 1)}), "elsewhere/nginx")
    assert sampler.observe(moved).host_apps == ()  # not 10 cores from two different counters


def msgspec_replace_dir(reading: core.NodeReading, cgroup_dir: str) -> core.NodeReading:
    import msgspec

    apps = tuple(msgspec.structs.replace(a, cgroup_dir=cgroup_dir) for a in reading.host_apps)
    return msgspec.structs.replace(reading, host_apps=apps)


def test_system_usage_stays_clamped_with_host_applications() -> None:
    sampler = core.Sampler()
    sampler.observe(_reading(0.0, 0, {"big": (0, 10**9)}))
    tick = sampler.observe(_reading(1.0, 100, {"big": (5_000_000_000, 10**9)}))
    assert tick.system is not None and tick.system[1:] == (0.0, 0)


# --- BatchBuilder


def _tick(at: float, apps: dict[str, float]) -> core.Tick:
    return core.Tick(
        at=at,
        node=(at, 2.0, 100),
        node_memory_with_page_cache=200,
        system=(at, 0.5, 10),
        host_apps=tuple(
            core.HostAppSample(
                name=name, priority="koord-mid", qos="BE", sample=(at, cpu, 30), memory_with_page_cache=40
            )
            for name, cpu in apps.items()
        ),
    )


def test_batches_carry_each_host_application_by_name_and_decode() -> None:
    builder = BatchBuilder("node-a", interval=10)
    builder.add(_tick(1001.0, {"sshd": 0.1, "nginx": 1.0}))
    builder.add(_tick(1002.0, {"nginx": 1.5}))
    batch = builder.close(sent_at=1010.0)
    assert batch is not None
    assert batch.host_applications == [
        HostApplicationSamples(
            name="nginx",
            priority="koord-mid",
            qos="BE",
            samples=[(1001.0, 1.0, 30), (1002.0, 1.5, 30)],
            memory_with_page_cache=[40, 40],
        ),
        HostApplicationSamples(
            name="sshd", priority="koord-mid", qos="BE", samples=[(1001.0, 0.1, 30)], memory_with_page_cache=[40]
        ),
    ]
    assert NODE_EVENT_DECODER.decode(encode_node_event(batch)) == batch
    builder.add(_tick(1011.0, {}))
    after = builder.close(sent_at=1020.0)
    assert after is not None and after.host_applications == []  # each window starts empty
    only_apps = core.Tick(
        at=1021.0, node=None, node_memory_with_page_cache=0, system=None, host_apps=_tick(1021.0, {"a": 1.0}).host_apps
    )
    builder.add(only_apps)
    assert builder.close(sent_at=1030.0) is not None  # host application samples alone make a batch
