"""CPI's pure part (agent.cpi, issue 23 point 6): the perf_event_attr layout the kernel reads, a group read decoded,
multiplexed counts scaled, the arithmetic, which pods a round counts, and what a refused perf_event_open means; the
CPI counts joined to the pods' samples and batched (agent.batch), and the batch field on the wire (schemas.cpi)."""

from __future__ import annotations

import ctypes
import errno
import struct

import msgspec
import pytest

from agent import cpi
from agent.batch import BatchBuilder, attach_cpi
from agent.core import PodSample, Tick
from schemas.cpi import MAX_POD_CPI_SAMPLES, PodCpiSample
from schemas.node import NODE_EVENT_DECODER, MetricCollectPolicy, NodeMetricsReported, PodRef, encode_node_event
from services.nodemetric.window import NodeWindow, compute_status

UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

# --- perf_event_attr


def test_attr_layout_matches_the_kernels_published_sizes() -> None:
    attr = cpi.PerfEventAttr
    assert ctypes.sizeof(attr) == cpi.PERF_ATTR_SIZE_VER8 == 136
    # Each PERF_ATTR_SIZE_VERn of include/uapi/linux/perf_event.h ends where the next field starts.
    assert attr.config.offset == 8 and attr.read_format.offset == 32
    assert attr.wakeup_events.offset == 48
    assert attr.config2.offset == 64  # VER0 = 64
    assert attr.branch_sample_type.offset == 72  # VER1 = 72
    assert attr.sample_regs_user.offset == 80  # VER2 = 80
    assert attr.sample_regs_intr.offset == 96  # VER3 = 96
    assert attr.aux_watermark.offset == 104  # VER4 = 104
    assert attr.aux_sample_size.offset == 112  # VER5 = 112
    assert attr.sig_data.offset == 120  # VER6 = 120
    assert attr.config3.offset == 128  # VER7 = 128


def test_attr_bytes_of_a_group_leader_and_member() -> None:
    leader = cpi.attr_bytes(cpi.CYCLES, leader=True)
    member = cpi.attr_bytes(cpi.INSTRUCTIONS, leader=False)
    assert len(leader) == len(member) == 136
    kind, size, config, period, sample_type, read_format, flags = struct.unpack_from("=IIQQQQQ", leader)
    assert (kind, size, config, period, sample_type) == (0, 136, 0, 0, 0)
    assert read_format == cpi.READ_FORMAT == 0b1011  # GROUP | TOTAL_TIME_RUNNING | TOTAL_TIME_ENABLED
    assert flags == 1 << 0 | 1 << 6  # disabled, exclude_hv; not inherit (bit 1), not exclude_kernel (bit 5)
    kind, _size, config, *_rest, flags = struct.unpack_from("=IIQQQQQ", member)
    assert (kind, config, flags) == (0, 1, 1 << 6)  # instructions follow the leader: not disabled themselves
    assert leader[48:] == bytes(136 - 48) and member[48:] == bytes(136 - 48)  # what an older kernel must see as 0
    software = cpi.attr_bytes(cpi.TASK_CLOCK, leader=True)
    assert struct.unpack_from("=IIQ", software) == (1, 136, 1)


# --- reads, scaling, arithmetic


def group_read(enabled: int, running: int, *values: int, nr: int | None = None) -> bytes:
    return struct.pack(f"={3 + len(values)}Q", len(values) if nr is None else nr, enabled, running, *values)


def test_a_group_read_is_decoded_and_a_bad_one_refused() -> None:
    assert cpi.read_size(2) == 40
    got = cpi.decode_group_read(group_read(1000, 500, 7_000, 3_000), 2)
    assert got == cpi.GroupRead(enabled_ns=1000, running_ns=500, values=(7_000, 3_000))
    with pytest.raises(cpi.PerfReadError, match="is 40 bytes, got 32"):
        cpi.decode_group_read(group_read(1000, 500, 7_000), 2)
    with pytest.raises(cpi.PerfReadError, match="holds 3 counters, 2 were opened"):
        cpi.decode_group_read(group_read(1000, 500, 7_000, 3_000, nr=3), 2)


def test_multiplexed_counts_are_scaled_to_the_enabled_time() -> None:
    assert cpi.scaled(1_000, enabled_ns=10, running_ns=10) == 1_000.0  # counted all the time
    assert cpi.scaled(1_000, enabled_ns=10, running_ns=4) == 2_500.0  # the PMU gave it 40 % of the time
    assert cpi.scaled(1_000, enabled_ns=0, running_ns=0) == 1_000.0  # the root cgroup's counter reads 0 / 0 times
    assert cpi.scaled(0, enabled_ns=0, running_ns=0) == 0.0  # a CPU the cgroup never ran on
    assert cpi.scaled(1_000, enabled_ns=10, running_ns=0) == 1_000.0  # never scheduled: no scale to apply
    reads = [
        cpi.GroupRead(enabled_ns=100, running_ns=100, values=(6_000, 3_000)),
        cpi.GroupRead(enabled_ns=100, running_ns=50, values=(1_000, 1_000)),
        cpi.GroupRead(enabled_ns=0, running_ns=0, values=(0, 0)),
    ]
    assert cpi.totals(reads, 2) == (8_000.0, 5_000.0)
    count = cpi.count_of(reads, t=1_000.0, seconds=10.0)
    assert count == cpi.CpiCount(t=1_000.0, seconds=10.0, cycles=8_000.0, instructions=5_000.0)
    assert count.cpi == pytest.approx(1.6)
    assert cpi.cpi(4_000.0, 0.0) is None  # an idle pod counts no instruction: no CPI, not infinity


# --- rounds


def test_a_round_counts_every_pod_when_their_descriptors_fit() -> None:
    pods = ["a", "b", "c"]
    assert cpi.plan_round(pods, fds_per_pod=2 * 8, max_fds=1_000, offset=2) == (pods, 0)
    assert cpi.plan_round([], fds_per_pod=16, max_fds=1_000, offset=2) == ([], 0)


def test_rounds_count_the_pods_in_turn_when_descriptors_are_short() -> None:
    pods = ["a", "b", "c", "d", "e"]
    offset, counted = 0, []
    for _ in range(5):
        chosen, offset = cpi.plan_round(pods, fds_per_pod=16, max_fds=32, offset=offset)
        assert len(chosen) == 2
        counted += chosen
    assert counted == ["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"]  # every pod, each as often
    assert cpi.plan_round(pods, fds_per_pod=64, max_fds=32, offset=3) == ([], 3)  # not even one pod fits


# --- refusals explained


def test_a_refusal_names_its_errno_and_likely_cause() -> None:
    assert cpi.explain_errno(errno.ENOENT).startswith("ENOENT: ") and "PMU" in cpi.explain_errno(errno.ENOENT)
    assert "paranoid is 2" in cpi.explain_errno(errno.EACCES, paranoid=2)
    assert "paranoid is unknown" in cpi.explain_errno(errno.EACCES)
    assert "seccomp" in cpi.explain_errno(errno.EPERM, paranoid=2)
    assert "perf_event controller" in cpi.explain_errno(errno.ENOENT, cgroup=True)
    assert "perf_event controller" in cpi.explain_errno(errno.EBADF, cgroup=True)
    assert cpi.explain_errno(errno.EMFILE, cgroup=True).startswith("EMFILE: ")  # not a cgroup matter
    assert cpi.explain_errno(errno.EXDEV) == "EXDEV: perf_event_open failed"
    assert cpi.explain_errno(100_000) == "errno 100000: perf_event_open failed"


# --- into the batch


def tick(at: float, uids: list[str], counts: dict[str, cpi.CpiCount] | None = None) -> Tick:
    pods = tuple(
        PodSample(pod=PodRef(uid=uid, kube_qos="Burstable"), sample=(at, 0.5, 1 << 20), memory_with_page_cache=1 << 21)
        for uid in uids
    )
    return Tick(
        at=at,
        node=(at, 1.0, 1 << 30),
        node_memory_with_page_cache=1 << 31,
        system=(at, 0.5, 1 << 29),
        pods=attach_cpi(pods, counts or {}),
    )


def round_trip(batch: NodeMetricsReported) -> NodeMetricsReported:
    decoded = NODE_EVENT_DECODER.decode(encode_node_event(batch))
    assert isinstance(decoded, NodeMetricsReported)
    return decoded


def test_cpi_counts_reach_the_batch_by_pod_index_and_round_trip() -> None:
    builder = BatchBuilder("node-a.example", interval=10.0)
    count = cpi.CpiCount(t=1002.5, seconds=10.0, cycles=3.0e10, instructions=2.0e10)
    gone = cpi.CpiCount(t=1002.5, seconds=10.0, cycles=1.0, instructions=1.0)
    builder.add(tick(1001.0, [UID_A, UID_B]))
    builder.add(tick(1003.0, [UID_A, UID_B], {UID_B: count, "0123456789abcdef0123456789abcdef": gone}))
    builder.add(tick(1004.0, [UID_A, UID_B]))
    batch = builder.close(sent_at=1010.0)
    assert batch is not None
    got = round_trip(batch)
    assert [p.uid for p in got.pods] == [UID_A, UID_B]
    assert got.pod_cpi == [PodCpiSample(pod=1, t=1002.5, seconds=10.0, cycles=3.0e10, instructions=2.0e10)]
    assert got.pod_cpi[0].cpi == pytest.approx(1.5)
    wire = msgspec.msgpack.decode(encode_node_event(got))
    assert wire["pod_cpi"] == [[1, 1002.5, 10.0, 3.0e10, 2.0e10]]  # array-like rows


def test_a_batch_without_cpi_keeps_its_wire_form() -> None:
    builder = BatchBuilder("node-a.example", interval=10.0)
    builder.add(tick(1001.0, [UID_A]))
    batch = builder.close(sent_at=1010.0)
    assert batch is not None and batch.pod_cpi == []
    assert "pod_cpi" not in msgspec.msgpack.decode(encode_node_event(batch))


def batch_with(rows: list[PodCpiSample], **fields: object) -> bytes:
    batch = NodeMetricsReported(
        node="node-a.example",
        window_start=1000.0,
        window_end=1010.0,
        sent_at=1010.0,
        pods=[PodRef(uid=UID_A, kube_qos="Burstable"), PodRef(uid=UID_B, kube_qos="BestEffort")],
        pod_cpi=rows,
    )
    return encode_node_event(msgspec.structs.replace(batch, **fields))


ROW = PodCpiSample(pod=0, t=1005.0, seconds=10.0, cycles=2.0e9, instructions=1.0e9)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([msgspec.structs.replace(ROW, cycles=-1.0)], r"Expected `float` >= 0.0 - at `\$\.pod_cpi\[0\]\[3\]`"),
        (
            [ROW, msgspec.structs.replace(ROW, pod=1, instructions=-5.0)],
            r"Expected `float` >= 0.0 - at `\$\.pod_cpi\[1\]\[4\]`",
        ),
        ([msgspec.structs.replace(ROW, cycles=float("nan"))], r">= 0.0 - at `\$\.pod_cpi\[0\]\[3\]`"),
        ([msgspec.structs.replace(ROW, instructions=float("inf"))], r"<= .* - at `\$\.pod_cpi\[0\]\[4\]`"),
        ([msgspec.structs.replace(ROW, seconds=0.0)], r"Expected `float` > 0.0 - at `\$\.pod_cpi\[0\]\[2\]`"),
        ([msgspec.structs.replace(ROW, seconds=7200.0)], r"<= 3600.0 - at `\$\.pod_cpi\[0\]\[2\]`"),
        (
            [ROW, msgspec.structs.replace(ROW, pod=2)],
            r"index 2 is out of range, the batch lists 2 pods - at `\$\.pod_cpi\[1\]`",
        ),
        ([ROW, ROW], r"pod 0 has two rows ending at 1005.0 - at `\$\.pod_cpi\[1\]`"),
        ([ROW] * (MAX_POD_CPI_SAMPLES + 1), r"Expected `array` of length <= 65536 - at `\$\.pod_cpi`"),
    ],
)
def test_bad_cpi_rows_are_refused_with_their_path(rows: list[PodCpiSample], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message):
        NODE_EVENT_DECODER.decode(batch_with(rows))


def test_rows_of_a_pod_list_sent_earlier_are_left_to_the_reader() -> None:
    far = msgspec.structs.replace(ROW, pod=7)  # the batch names its pod list by digest: 7 may be in range there
    got = NODE_EVENT_DECODER.decode(batch_with([far], pods=[], pods_digest=12345))
    assert isinstance(got, NodeMetricsReported) and got.pod_cpi == [far]


def test_nodemetric_takes_a_batch_with_cpi_as_one_without() -> None:
    policy = MetricCollectPolicy()

    def window_after(cpi_rows: list[PodCpiSample]) -> object:
        window = NodeWindow(policy)
        for start in (1000.0, 1010.0):
            builder = BatchBuilder("node-a.example", interval=10.0)
            for at in (start + 1, start + 2):
                builder.add(tick(at, [UID_A, UID_B]))
            batch = builder.close(sent_at=start + 10)
            assert batch is not None
            assert window.add(round_trip(msgspec.structs.replace(batch, pod_cpi=cpi_rows)))
        return compute_status(window, report_time=1020.0, spec=policy), window.psi_metric(1020.0)

    assert window_after([ROW]) == window_after([])
