"""The agent's topology report from file contents (agent.topology, pure): each parser on strings, then the whole
report on in-memory files — zones and their memory less huge pages, CPU basic info, the kubelet's CPU manager state
in every shape it comes in, and the schema's bounds — and the simulated node's report (agent.simulate_topology)."""

from __future__ import annotations

import json

import msgspec
import pytest

from agent import topology
from agent.simulate_topology import SIMULATED_CPU_MODEL, simulated_cpus, simulated_topology
from agent.suppress import Cpu, parse_cpuset
from schemas import node_topology as nt
from schemas.node_topology import TOPOLOGY_DECODER, encode_topology

GiB = 1024**3
MiB = 1024**2
LAYOUT = topology.Layout(sys_root="/host/sys", proc_root="/host/proc", kubelet_root_dir="/var/lib/kubelet")
STATE = LAYOUT.kubelet_state
UID_A = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
UID_B = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"


# --- parsers


def test_mem_total_of_a_numa_node_and_of_the_machine() -> None:
    node = "Node 1 MemTotal:       16777216 kB\nNode 1 MemFree:        1024 kB\n"
    assert topology.mem_total_bytes(node) == 16 * GiB
    machine = "MemTotal:        8388608 kB\nMemFree:         1234 kB\nMemAvailable:    4321 kB\n"
    assert topology.mem_total_bytes(machine) == 8 * GiB
    with pytest.raises(ValueError, match="no MemTotal"):
        topology.mem_total_bytes("Node 0 MemFree: 1 kB\n")
    with pytest.raises(ValueError, match="no MemTotal"):
        topology.mem_total_bytes("MemTotal: 12 MB\n")
    with pytest.raises(ValueError, match="beyond"):
        topology.mem_total_bytes(f"MemTotal: {2**60} kB\n")


def test_hugepage_count() -> None:
    assert topology.hugepage_count("512\n") == 512
    assert topology.hugepage_count("0") == 0
    for bad in ("", "-1", "1.5", "²", "lots"):
        with pytest.raises(ValueError, match="not a page count"):
            topology.hugepage_count(bad)


def test_cpu_model_takes_the_first_processor_and_tolerates_arm() -> None:
    x86 = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8369B CPU @ 2.70GHz\nflags\t\t: fpu vme\n\n"
        "processor\t: 1\nvendor_id\t: Other\nmodel name\t: Other\n"
    )
    assert topology.cpu_model(x86) == ("Intel(R) Xeon(R) Platinum 8369B CPU @ 2.70GHz", "GenuineIntel")
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    assert topology.cpu_model(arm) == ("", "")
    assert topology.cpu_model(f"model name\t: {'x' * 1000}\n")[0] == "x" * 256


def test_hyper_threading_is_two_logical_cpus_on_one_core_of_one_socket() -> None:
    siblings = [Cpu(id=0, core=0, socket=0, numa=0), Cpu(id=1, core=0, socket=0, numa=0)]
    assert topology.hyper_threading(siblings)
    same_core_id_other_socket = [Cpu(id=0, core=0, socket=0, numa=0), Cpu(id=1, core=0, socket=1, numa=1)]
    assert not topology.hyper_threading(same_core_id_other_socket)
    assert not topology.hyper_threading([])


@pytest.mark.parametrize(
    ("no_turbo", "boost", "on"),
    [
        ("0\n", None, True),
        ("1\n", None, False),
        ("1\n", "1\n", False),  # intel_pstate decides when it is there
        (None, "1\n", True),
        (None, "0\n", False),
        (None, None, False),
    ],
)
def test_turbo(no_turbo: str | None, boost: str | None, on: bool) -> None:
    assert topology.turbo_enabled(no_turbo, boost) is on


def test_cpu_manager_state_static_with_entries() -> None:
    data = json.dumps(
        {
            "policyName": "static",
            "defaultCpuSet": "0-1,6-7",
            "entries": {UID_B: {"main": "4-5"}, UID_A: {"main": "2", "sidecar": "3"}, "c0ffee": {"init": ""}},
            "checksum": 3152479423,
        }
    ).encode()
    state = topology.parse_cpu_manager_state(data)
    assert state.policy == "static"
    assert state.default_cpus == {0, 1, 6, 7}
    assert state.pods == {UID_A: {2, 3}, UID_B: {4, 5}}  # the pod with no CPUs is left out


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not a CPU manager checkpoint"),
        (b"[]", "not a CPU manager checkpoint"),
        (b'{"defaultCpuSet": "0-3"}', "not a CPU manager checkpoint"),  # no policyName
        (b'{"policyName": "static", "entries": {"u": {"c": 3}}}', "not a CPU manager checkpoint"),
        (b'{"policyName": ""}', "is not a policy name"),
        (b'{"policyName": "static", "defaultCpuSet": "3-1"}', "defaultCpuSet: bad cpuset '3-1'"),
        (b'{"policyName": "static", "defaultCpuSet": "0-99999"}', "defaultCpuSet: bad cpuset"),
        (b'{"policyName": "static", "entries": {"u1": {"main": "x"}}}', "entry u1/main: bad cpuset 'x'"),
        (b'{"policyName": "static", "entries": {"../etc": {"main": "1"}}}', "is not a pod UID"),
    ],
)
def test_a_malformed_cpu_manager_state_says_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        topology.parse_cpu_manager_state(data)


def test_an_oversized_cpu_manager_state_is_refused() -> None:
    with pytest.raises(ValueError, match="larger than 1048576 bytes"):
        topology.parse_cpu_manager_state(b" " * (topology.MAX_STATE_FILE_BYTES + 1))


def test_problems_are_cut_to_the_schemas_bounds() -> None:
    many = [f"problem {i}" for i in range(100)] + ["x" * 5000]
    bounded = topology.bounded_problems(many)
    assert len(bounded) == nt.MAX_PROBLEMS
    assert bounded[-1] == f"… and {101 - nt.MAX_PROBLEMS + 1} more problems"
    assert len(topology.bounded_problems(["x" * 5000])[0]) == topology.MAX_PROBLEM_CHARS


# --- the report from in-memory files


def two_node_machine(*, hyper_threads: bool = True) -> tuple[list[Cpu], dict[str, bytes | topology.Unreadable]]:
    """8 logical CPUs, 2 sockets = 2 NUMA nodes of 16 GiB; node 0 with 4 × 2 MiB and 1 × 1 GiB huge pages."""
    cpus = [Cpu(id=i, core=(i % 4) if hyper_threads else i, socket=(i % 4) // 2, numa=(i % 4) // 2) for i in range(8)]
    files: dict[str, bytes | topology.Unreadable] = {
        LAYOUT.cpuinfo: b"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7K62 48-Core Processor\n",
        LAYOUT.boost: b"1\n",
        LAYOUT.node_file(0, "cpulist"): b"0-1,4-5\n",
        LAYOUT.node_file(1, "cpulist"): b"2-3,6-7\n",
        LAYOUT.node_file(0, "meminfo"): b"Node 0 MemTotal:       16777216 kB\nNode 0 MemFree: 1 kB\n",
        LAYOUT.node_file(1, "meminfo"): b"Node 1 MemTotal:       16777216 kB\nNode 1 MemFree: 1 kB\n",
        LAYOUT.hugepages(0, "2048kB"): b"4\n",
        LAYOUT.hugepages(0, "1048576kB"): b"1\n",
        LAYOUT.hugepages(1, "2048kB"): b"0\n",
        LAYOUT.hugepages(1, "1048576kB"): b"0\n",
    }
    return cpus, files


def build(
    cpus: list[Cpu], files: dict[str, bytes | topology.Unreadable], node_ids: list[int], **kw: object
) -> nt.NodeTopologyReported:
    report = topology.build_report(
        node="node-a",
        at=1000.0,
        layout=LAYOUT,
        cpus=cpus,
        node_ids=node_ids,
        files=files,
        **kw,  # type: ignore[arg-type]
    )
    assert TOPOLOGY_DECODER.decode(encode_topology(report)) == report  # always within the schema's bounds
    return report


def test_a_two_node_machine() -> None:
    cpus, files = two_node_machine()
    report = build(cpus, files, [0, 1], reserved_cpus="0,1")
    assert report.problems == []
    assert report.zones == [
        nt.NumaZoneReport(
            numa=0,
            cpus="0-1,4-5",
            cpu_count=4,
            memory=16 * GiB - 8 * MiB - GiB,
            hugepages_2mi=8 * MiB,
            hugepages_1gi=GiB,
        ),
        nt.NumaZoneReport(numa=1, cpus="2-3,6-7", cpu_count=4, memory=16 * GiB),
    ]
    assert [(c.id, c.core, c.socket, c.numa) for c in report.cpus][:3] == [(0, 0, 0, 0), (1, 1, 0, 0), (2, 2, 1, 1)]
    assert report.basic == nt.CpuBasicInfo(
        cpu_model="AMD EPYC 7K62 48-Core Processor",
        vendor_id="AuthenticAMD",
        hyper_thread_enabled=True,
        turbo_enabled=True,
    )
    assert report.kubelet == nt.KubeletCpuManager(policy="none", reserved_cpus="0-1")  # no state file


def test_huge_pages_beyond_mem_total_leave_no_negative_memory() -> None:
    cpus, files = two_node_machine()
    files[LAYOUT.hugepages(1, "1048576kB")] = b"20\n"
    assert build(cpus, files, [0, 1]).zones[1].memory == 0


def test_a_machine_without_numa_directories_is_one_zone_with_procs_mem_total() -> None:
    cpus = [Cpu(id=i, core=i, socket=0, numa=0) for i in range(4)]
    files: dict[str, bytes | topology.Unreadable] = {
        LAYOUT.cpuinfo: b"vendor_id\t: GenuineIntel\nmodel name\t: QEMU Virtual CPU version 2.5+\n",
        LAYOUT.machine_meminfo: b"MemTotal:        8388608 kB\nMemFree:  100 kB\n",
        LAYOUT.hugepages(None, "2048kB"): b"512\n",
        LAYOUT.no_turbo: b"1\n",
    }
    report = build(cpus, files, [])
    assert report.problems == []
    assert report.zones == [nt.NumaZoneReport(numa=0, cpus="0-3", cpu_count=4, memory=7 * GiB, hugepages_2mi=GiB)]
    assert not report.basic.hyper_thread_enabled and not report.basic.turbo_enabled


def test_offline_cpus_are_not_counted_and_unlisted_ones_are_said() -> None:
    cpus, files = two_node_machine()
    online = [c for c in cpus if c.id != 5]  # cpu 5 taken offline; node0/cpulist still names it
    report = build(online, files, [0, 1])
    assert (report.zones[0].cpus, report.zones[0].cpu_count) == ("0-1,4", 3)
    files[LAYOUT.node_file(1, "cpulist")] = b"2-3\n"
    report = build(online, files, [0, 1])
    assert report.problems == ["online CPUs 6-7 are in no NUMA node's cpulist"]


def test_missing_unreadable_and_malformed_files_are_problems_naming_the_file() -> None:
    cpus, files = two_node_machine()
    del files[LAYOUT.cpuinfo]
    files[LAYOUT.node_file(0, "meminfo")] = b"garbage\n"
    files[LAYOUT.node_file(1, "cpulist")] = topology.Unreadable("Permission denied")
    files[LAYOUT.hugepages(0, "2048kB")] = b"many\n"
    report = build(cpus, files, [0, 1])
    assert report.problems == [
        f"{LAYOUT.node_file(0, 'meminfo')}: no MemTotal line in kB",
        f"{LAYOUT.hugepages(0, '2048kB')}: not a page count: 'many'",
        f"{LAYOUT.node_file(1, 'cpulist')}: cannot read: Permission denied",
        "online CPUs 2-3,6-7 are in no NUMA node's cpulist",
        f"{LAYOUT.cpuinfo}: missing",
    ]
    assert report.zones[0].memory == 0 and report.zones[0].hugepages_1gi == GiB  # what could be read stays
    assert report.zones[1] == nt.NumaZoneReport(numa=1, memory=16 * GiB)
    assert report.basic.cpu_model == ""


def test_out_of_range_ids_are_left_out_with_a_problem() -> None:
    cpus = [Cpu(id=0, core=0, socket=-1, numa=0), Cpu(id=1, core=1, socket=0, numa=0)]
    files: dict[str, bytes | topology.Unreadable] = {LAYOUT.machine_meminfo: b"MemTotal: 1024 kB\n"}
    report = build(cpus, files, [0, 2000], reserved_cpus="")
    assert [c.id for c in report.cpus] == [1]
    assert report.problems[0].startswith(
        "1 CPUs left out of the CPU list: a core, socket or NUMA id out of range (cpu 0: core 0, socket -1"
    )
    assert report.problems[1] == "NUMA nodes [2000] left out: ids above 1023"
    assert [z.numa for z in report.zones] == [0]


def test_a_cpu_list_beyond_the_schemas_length_is_cut_at_a_whole_entry() -> None:
    every_other = list(range(0, 8192, 2))  # "0,2,4,…": 4096 entries, about 19,000 characters
    cpus = [Cpu(id=i, core=i, socket=0, numa=0) for i in every_other]
    files: dict[str, bytes | topology.Unreadable] = {LAYOUT.machine_meminfo: b"MemTotal: 1024 kB\n"}
    report = build(cpus, files, [])
    zone = report.zones[0]
    assert len(zone.cpus) <= topology.MAX_LIST_CHARS and zone.cpu_count == 4096
    assert zone.cpus.startswith("0,2,4,") and not zone.cpus.endswith(",")
    assert any(p.startswith("a cpu list of ") and "cut to" in p for p in report.problems)


def kubelet_of(state: bytes | topology.Unreadable | None, **kw: object) -> nt.NodeTopologyReported:
    cpus, files = two_node_machine()
    if state is not None:
        files[STATE] = state
    return build(cpus, files, [0, 1], **kw)


def test_the_kubelet_part_absent_none_and_static() -> None:
    assert kubelet_of(None).kubelet == nt.KubeletCpuManager()
    none = json.dumps({"policyName": "none", "defaultCpuSet": "", "checksum": 1353318690}).encode()
    assert kubelet_of(none).kubelet == nt.KubeletCpuManager(policy="none")
    static = json.dumps(
        {
            "policyName": "static",
            "defaultCpuSet": "0-1,4-5,7",
            "entries": {UID_B: {"main": "6"}, UID_A: {"main": "2-3", "sidecar": "3"}},
            "checksum": 1,
        }
    ).encode()
    report = kubelet_of(static, reserved_cpus="1,0")
    assert report.problems == []
    assert report.kubelet == nt.KubeletCpuManager(
        policy="static",
        default_cpus="0-1,4-5,7",
        reserved_cpus="0-1",
        pod_allocs=[nt.PodCpuAlloc(uid=UID_A, cpus="2-3"), nt.PodCpuAlloc(uid=UID_B, cpus="6")],
    )


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        (b'{"policyName": "static", "defaultCpuSet": "0-', "not a CPU manager checkpoint"),
        (b'{"policyName": "static", "defaultCpuSet": "a-b"}', "defaultCpuSet: bad cpuset 'a-b'"),
        (b" " * (topology.MAX_STATE_FILE_BYTES + 1), "larger than 1048576 bytes"),
        (topology.Unreadable("Permission denied"), "cannot read: Permission denied"),
    ],
)
def test_a_bad_kubelet_state_file_is_a_problem_and_leaves_the_defaults(
    state: bytes | topology.Unreadable, problem: str
) -> None:
    report = kubelet_of(state, reserved_cpus="0")
    assert report.kubelet == nt.KubeletCpuManager(reserved_cpus="0")
    assert len(report.problems) == 1 and report.problems[0].startswith(f"{STATE}: {problem}")


def test_more_pods_than_the_schema_holds_are_cut_with_a_problem() -> None:
    entries = {f"pod-{i:05d}": {"main": str(i % 8)} for i in range(nt.MAX_POD_ALLOCS + 5)}
    report = kubelet_of(json.dumps({"policyName": "static", "entries": entries}).encode())
    assert len(report.kubelet.pod_allocs) == nt.MAX_POD_ALLOCS
    assert report.kubelet.pod_allocs[0].uid == "pod-00000"
    assert report.problems == [f"{STATE}: {nt.MAX_POD_ALLOCS + 5} pods with exclusive CPUs, only the first 4096 listed"]


def test_a_bad_reserved_cpus_setting_is_a_problem() -> None:
    report = kubelet_of(None, reserved_cpus="0-x")
    assert report.kubelet.reserved_cpus == ""
    assert report.problems[0].startswith("the reserved_cpus setting '0-x'")


def test_same_topology_ignores_only_the_time() -> None:
    cpus, files = two_node_machine()
    first = build(cpus, files, [0, 1])
    later = msgspec.structs.replace(first, at=2000.0)
    assert topology.same_topology(first, later)
    files[LAYOUT.hugepages(1, "2048kB")] = b"1\n"
    assert not topology.same_topology(first, build(cpus, files, [0, 1]))


def test_the_files_a_report_reads() -> None:
    with_nodes = dict(LAYOUT.files([1, 0]))
    assert with_nodes[STATE] == topology.MAX_STATE_FILE_BYTES + 1
    assert "/host/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages" in with_nodes
    assert LAYOUT.machine_meminfo not in with_nodes
    without = dict(LAYOUT.files([]))
    assert {LAYOUT.machine_meminfo, "/host/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"} <= set(without)


# --- simulated nodes


@pytest.mark.parametrize(("cores", "zones", "ht"), [(32.0, 2, True), (8.0, 1, True), (3.0, 1, False), (64.0, 2, True)])
def test_a_simulated_node_reports_a_consistent_machine(cores: float, zones: int, ht: bool) -> None:
    report = simulated_topology("sim-node-0001", cpu_cores=cores, memory_bytes=128 * GiB, at=1000.0)
    assert TOPOLOGY_DECODER.decode(encode_topology(report)) == report
    assert report.problems == []
    assert len(report.zones) == zones
    assert sum(z.cpu_count for z in report.zones) == len(report.cpus) == int(cores)
    assert sum(z.memory for z in report.zones) == 128 * GiB
    assert report.basic.hyper_thread_enabled is ht and report.basic.cpu_model == SIMULATED_CPU_MODEL
    assert report.kubelet == nt.KubeletCpuManager()
    by_zone = {z.numa: parse_cpuset(z.cpus) for z in report.zones}
    assert all(c.id in by_zone[c.numa] for c in report.cpus)


def test_simulated_cpus_are_numbered_as_linux_numbers_a_two_socket_machine() -> None:
    cpus = simulated_cpus(16)
    assert [(c.id, c.core, c.socket) for c in cpus[:5]] == [(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 3, 0), (4, 0, 1)]
    assert (cpus[8].core, cpus[8].socket) == (0, 0)  # cpu 8: the sibling of cpu 0
