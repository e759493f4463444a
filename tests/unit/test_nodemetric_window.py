"""NodeWindow's compact state: pod lists named by digest, pod buckets merged per report-grid chunk, and the
agent-side PodListThinner that decides when a batch may leave its pod list out."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from agent.batch import PodListThinner
from schemas import node
from services.nodemetric.service import liveness_due
from services.nodemetric.window import NodeWindow, compute_status, pod_chunk_seconds
from tests.support import batches as wire

POLICY = node.MetricCollectPolicy()  # report every 60 s, pods averaged over 300 s


def refs(*uids: str) -> list[node.PodRef]:
    return [node.PodRef(uid=uid, namespace="ns", name=uid) for uid in uids]


def batch(
    start: float, pods: Sequence[node.PodRef], *, cpu: float = 0.5, listed: bool = True, quiet: Sequence[str] = ()
) -> node.NodeMetricsReported:
    """One 10 s batch in which every pod but the `quiet` ones uses `cpu` cores and 64 bytes each second; with
    `listed=False` the pod list is named by digest only, as a thinned agent batch does."""
    rows = [(ref, [] if ref.uid in quiet else [(start + i, cpu, 64) for i in range(10)]) for ref in pods]
    full = node.NodeMetricsReported(
        node="n1",
        window_start=start,
        window_end=start + 10,
        sent_at=start + 10,
        node_samples=[(start + i, 1.0, 1000) for i in range(10)],
        system_samples=[(start + i, 0.5, 100) for i in range(10)],
        pods_digest=node.pod_list_digest(pods),
        **wire.pod_columns(rows),
    )
    return full if listed else msgspec.structs.replace(full, pods=[])


def pod_usage(window: NodeWindow, report_time: float) -> dict[str, dict[str, int]]:
    status = compute_status(window, report_time=report_time, spec=POLICY)
    return {p.name: p.pod_usage.resources for p in status.pods_metric}


def test_a_pod_list_named_by_digest_is_the_one_sent_before() -> None:
    window = NodeWindow(POLICY)
    pods = refs("a", "b")
    window.add(batch(0, pods))
    for start in range(10, 60, 10):
        window.add(batch(start, pods, cpu=1.5, listed=False))
    assert window.unattributed_batches == 0
    # 10 s at 0.5 and 50 s at 1.5 cores: the thinned batches count for the pods they name
    assert pod_usage(window, 60.0) == {"a": {"cpu": 1333, "memory": 64}, "b": {"cpu": 1333, "memory": 64}}


def test_rows_naming_an_unknown_pod_list_are_dropped_and_counted_but_node_samples_stay() -> None:
    window = NodeWindow(POLICY)
    window.add(batch(0, refs("a"), listed=False))  # a replica that starts mid-stream never saw the list
    window.add(batch(10, refs("a"), listed=False))
    assert window.unattributed_batches == 2
    status = compute_status(window, report_time=20.0, spec=POLICY)
    assert status.pods_metric == [] and status.node_metric.node_usage.resources == {"cpu": 1000, "memory": 1000}
    window.add(batch(20, refs("a")))  # the periodic resend
    window.add(batch(30, refs("a"), listed=False))
    assert window.unattributed_batches == 2 and pod_usage(window, 40.0) == {"a": {"cpu": 500, "memory": 64}}


def test_older_pod_lists_are_remembered_for_late_batches() -> None:
    window = NodeWindow(POLICY)
    window.add(batch(0, refs("a")))
    window.add(batch(20, refs("a", "b")))
    window.add(batch(10, refs("a"), listed=False))  # arrives late, names the list before the change
    assert window.unattributed_batches == 0
    assert pod_usage(window, 60.0) == {"a": {"cpu": 500, "memory": 64}, "b": {"cpu": 500, "memory": 64}}


def test_batches_of_one_report_chunk_merge_into_one_bucket_per_pod() -> None:
    assert pod_chunk_seconds(POLICY) == 60
    assert pod_chunk_seconds(node.MetricCollectPolicy(report_interval_seconds=90)) == 30  # gcd(90, 300)
    window = NodeWindow(POLICY, phase=20)
    pods = refs(*(f"p{i}" for i in range(50)))
    for start in range(20, 20 + 3600, 10):  # an hour of batches
        window.add(batch(start, pods, listed=start % 60 == 20))
    # 300 s window + a report interval + one compaction period, in 60 s chunks: at most 8 buckets per pod
    assert window.capacities()["pods"] <= 50 * 8 * 2  # the table doubles when it grows
    assert pod_usage(window, 3620.0) == {f"p{i}": {"cpu": 500, "memory": 64} for i in range(50)}


def test_a_batch_straddling_chunks_keeps_a_bucket_of_its_own() -> None:
    window = NodeWindow(POLICY)
    pods = refs("a")
    window.add(batch(0, pods))
    window.add(batch(55, pods, cpu=1.5))  # [55, 65) crosses the chunk boundary at 60
    # Report 60 covers [-240, 60): the straddler is not inside it, the first batch is.
    assert pod_usage(window, 60.0) == {"a": {"cpu": 500, "memory": 64}}
    assert pod_usage(window, 120.0) == {"a": {"cpu": 1000, "memory": 64}}


def test_pods_a_remembered_list_names_keep_their_slots() -> None:
    window = NodeWindow(POLICY)
    pods = refs("a", "b")
    window.add(batch(0, pods))
    for start in range(10, 1000, 10):  # "b" has no samples for far longer than any window, but stays listed
        window.add(batch(start, pods, listed=False, quiet=("b",)))
    assert window.unattributed_batches == 0 and set(window.pods) == {"a", "b"}
    window.add(batch(1000, pods, cpu=1.5, listed=False))  # "b" is back, under the slot the list names
    assert pod_usage(window, 1020.0)["b"] == {"cpu": 1500, "memory": 64}


@pytest.mark.parametrize("resend_every", [1, 3])
def test_thinner_sends_the_list_on_change_and_periodically(resend_every: int) -> None:
    thinner = PodListThinner(resend_every)
    lists = [refs("a")] * 5 + [refs("a", "b")] * 2
    sent = [thinner.thin(batch(10.0 * k, pods, listed=True)) for k, pods in enumerate(lists)]
    listed = [bool(b.pods) for b in sent]
    if resend_every == 1:
        assert listed == [True] * 7
    else:
        assert listed == [True, False, False, True, False, True, False]
    assert {b.pods_digest for b in sent} == {node.pod_list_digest(refs("a")), node.pod_list_digest(refs("a", "b"))}


def test_thinner_rejects_a_period_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1 batch"):
        PodListThinner(0)


@pytest.mark.parametrize(
    ("start", "end", "dropped", "grid", "due"),
    [
        (110, 120, 0, 30, True),  # reaches 120
        (120, 130, 0, 30, False),
        (130, 140, 0, 30, False),
        (140, 150, 0, 30, True),  # reaches 150
        (130, 140, 2, 30, True),  # dropped batches are always recorded
        (130, 140, 0, 0, True),  # grid 0: every batch
        (100, 160, 0, 30, True),  # a batch longer than the grid
    ],
)
def test_liveness_rows_are_written_once_per_grid_slot(
    start: float, end: float, dropped: int, grid: int, due: bool
) -> None:
    b = msgspec.structs.replace(batch(start, refs("a")), window_end=end, dropped_batches=dropped)
    assert liveness_due(b, grid=grid) is due


def test_node_and_system_series_with_different_times_are_both_kept() -> None:
    window = NodeWindow(POLICY)
    shared = batch(0, refs("a"))
    window.add(shared)
    skewed = msgspec.structs.replace(
        batch(10, refs("a")),
        node_samples=[(10.0 + i, 3.0, 3000) for i in range(10)],
        system_samples=[(10.5 + i, 1.5, 300) for i in range(5)],  # half the samples, at other instants
    )
    window.add(skewed)
    usage = compute_status(window, report_time=20.0, spec=POLICY).node_metric
    assert usage.node_usage.resources == {"cpu": 2000, "memory": 2000}  # 10 s at 1 core, 10 s at 3
    assert usage.system_usage.resources == {"cpu": 833, "memory": 166}  # 10 samples of 0.5, 5 of 1.5
