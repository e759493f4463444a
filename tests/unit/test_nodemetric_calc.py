"""NodeMetric calculations (spec §1.5–1.6): aggregations, the streaming window and the status it yields."""

from __future__ import annotations

import math
import statistics
import struct
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schemas import node, percentile
from services.nodemetric import aggregate, core
from services.nodemetric.window import NodeWindow, compute_status, due_report
from tests.support import batches as wire

POLICY = node.MetricCollectPolicy()
Sample = tuple[float, float, float]
PodRows = tuple[node.PodRef, Sequence[Sample]]


# --- reference implementations, written differently from the core on purpose


def _to_float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def reference_percentile(values: Sequence[float], p: float) -> float:
    """float32(n) × float32(p) is exact in float64 (24 + 24 bits); packing rounds it to float32 as Go does."""
    product = _to_float32(_to_float32(float(len(values))) * _to_float32(p))
    index = max(math.floor(product) - 1, 0)
    return sorted(values)[index]


# --- aggregation functions


@pytest.mark.parametrize(
    ("n", "p", "index"),
    [(20, 0.9, 17), (300, 0.99, 296), (1, 0.5, 0), (1, 0.99, 0), (2, 0.5, 0), (10, 0.95, 8), (100, 0.5, 49)],
)
def test_nearest_rank_index(n: int, p: float, index: int) -> None:
    assert percentile.nearest_rank_index(n, p) == index


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=1, max_size=2000),
    p=st.sampled_from(sorted(aggregate.PERCENTILES.values())),
)
def test_percentile_matches_reference(values: list[float], p: float) -> None:
    assert aggregate.percentile(values, p) == reference_percentile(values, p)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=1, max_size=2000))
def test_avg_matches_fmean(values: list[float]) -> None:
    assert aggregate.avg(values) == pytest.approx(statistics.fmean(values), rel=1e-12, abs=1e-12)


def test_percentile_uses_float32_product_at_the_edge() -> None:
    # 20 × 0.9 in float64 is 18.000000000000004 but 18.0 in float32: both floor to 18, index 17. 100 × 0.95
    # is 95.0 in float32 (float64: 95.0) -> index 94; 10 × 0.99 rounds to 9.9 -> index 8.
    values = list(range(1, 101))
    assert aggregate.percentile(values, 0.95) == 95
    assert aggregate.percentile(list(range(1, 11)), 0.99) == 9


def test_last_count_and_dispatch() -> None:
    assert aggregate.last([5.0, 1.0, 7.0]) == 7.0
    assert aggregate.last([5.0, 1.0, 7.0], times=[30, 50, 10]) == 1.0
    assert aggregate.count([1.0, 2.0]) == 2
    assert aggregate.count([]) == 0
    assert aggregate.aggregate("p50", [4.0, 1.0, 3.0, 2.0]) == 2.0
    assert aggregate.aggregate("count", [4.0, 1.0]) == 2


@pytest.mark.parametrize("name", ["avg", "p50", "p99", "last"])
def test_empty_samples_are_rejected(name: str) -> None:
    with pytest.raises(aggregate.AggregationError, match="no samples"):
        aggregate.aggregate(name, [])


def test_unknown_aggregation_is_rejected() -> None:
    with pytest.raises(aggregate.AggregationError, match="unknown aggregation 'p42'"):
        aggregate.aggregate("p42", [1.0])


def test_effective_policy_floors() -> None:
    eff = core.effective_policy(node.MetricCollectPolicy(aggregate_duration_seconds=10, report_interval_seconds=5))
    assert (eff.aggregate_duration_seconds, eff.report_interval_seconds) == (60, 30)
    eff = core.effective_policy(node.MetricCollectPolicy(aggregate_duration_seconds=600, report_interval_seconds=90))
    assert (eff.aggregate_duration_seconds, eff.report_interval_seconds) == (600, 90)


# --- compute_from_samples (the calc path, [start, end] inclusive)


def _from_samples(
    now: float, samples: Sequence[Sample], spec: node.MetricCollectPolicy = POLICY, **kw: Any
) -> node.NodeMetricStatus:
    return core.compute_from_samples(report_time=now, spec=spec, node_samples=samples, **kw)


def test_node_usage_and_aggregates_by_hand() -> None:
    spec = node.MetricCollectPolicy(aggregate_duration_seconds=60, durations_seconds=(60,))
    samples = [(930.0, 100.0, 9e9), (940.0, 1.0, 100), (960.0, 2.0, 200), (980.0, 3.0, 300), (1000.0, 4.0, 400)]
    status = _from_samples(1000.0, samples, spec)
    assert status.update_time == 1000.0
    assert status.node_metric.node_usage.resources == {"cpu": 2500, "memory": 250}
    usage = status.node_metric.aggregated_node_usages[0].usage
    assert {k: v.resources["cpu"] for k, v in usage.items()} == {
        "avg": 2500,
        "p50": 2000,
        "p90": 3000,
        "p95": 3000,
        "p99": 3000,
    }
    assert usage["p50"].resources["memory"] == 200


def test_amounts_truncate() -> None:
    status = _from_samples(100.0, [(90.0, 0.3333333, 10.9)])
    assert status.node_metric.node_usage.resources == {"cpu": 333, "memory": 10}


def test_empty_window_gives_empty_maps_not_zeros() -> None:
    status = _from_samples(10_000.0, [(1.0, 1.0, 1)])
    info = status.node_metric
    assert info.node_usage == node.ResourceMap()
    assert info.system_usage == node.ResourceMap()
    assert [a.duration_seconds for a in info.aggregated_node_usages] == [300, 600, 1800]
    assert all(rm == node.ResourceMap() for a in info.aggregated_node_usages for rm in a.usage.values())
    assert "resources" not in msgspec.to_builtins(info.node_usage)


@pytest.mark.parametrize(("span", "filled"), [(150.0, True), (149.0, False), (300.0, True), (0.0, False)])
def test_cold_start_needs_half_the_duration(span: float, filled: bool) -> None:
    spec = node.MetricCollectPolicy(durations_seconds=(300,))
    now = 1000.0
    samples = [(now - span, 1.0, 10), (now, 2.0, 20)]
    status = _from_samples(now, samples, spec)
    aggregated = status.node_metric.aggregated_node_usages[0].usage
    assert set(aggregated) == {"avg", "p50", "p90", "p95", "p99"}
    assert all(bool(rm.resources) is filled for rm in aggregated.values())
    # nodeUsage has no cold-start filter
    assert status.node_metric.node_usage.resources["cpu"] == 1500


def test_system_usage_uses_system_samples() -> None:
    status = _from_samples(100.0, [(90.0, 4.0, 100)], system_samples=[(80.0, 0.5, 7), (90.0, 1.5, 9)])
    assert status.node_metric.system_usage.resources == {"cpu": 1000, "memory": 8}


def test_pods_sorted_and_omitted_without_samples() -> None:
    pods = [
        core.PodSeries("z", "b", [(990.0, 1.0, 10)], "koord-batch", "BE"),
        core.PodSeries("a", "c", [(990.0, 0.25, 30), (995.0, 0.75, 50)], "koord-prod", "LS"),
        core.PodSeries("a", "gone", [(600.0, 1.0, 1)], "", ""),  # before the 300 s window
    ]
    status = _from_samples(1000.0, [(990.0, 2.0, 100)], pods=pods)
    rendered = [(p.namespace, p.name, p.pod_usage.resources, p.priority, p.qos) for p in status.pods_metric]
    assert rendered == [
        ("a", "c", {"cpu": 500, "memory": 40}, "koord-prod", "LS"),
        ("z", "b", {"cpu": 1000, "memory": 10}, "koord-batch", "BE"),
    ]


def test_counts_per_window() -> None:
    counts = core.count_from_samples(
        report_time=1000.0,
        spec=node.MetricCollectPolicy(durations_seconds=(60, 600)),
        node_samples=[(500.0, 1, 1), (950.0, 1, 1), (1000.0, 1, 1)],
        pods=[core.PodSeries("a", "p", [(990.0, 1, 1), (995.0, 1, 1)])],
    )
    assert [(c.duration_seconds, c.node_samples, c.pod_samples) for c in counts] == [
        (300, 2, 2),
        (60, 2, None),
        (600, 3, None),
    ]


# --- the streaming window


def _batch(
    start: float,
    *,
    seconds: int = 10,
    cpu: float = 1.0,
    mem: int = 1000,
    pods: Sequence[PodRows] = (),
    pod_page_cache: Sequence[int] = (),
    **extra: Any,
) -> node.NodeMetricsReported:
    ts = [start + i for i in range(seconds)]
    return node.NodeMetricsReported(
        node="n1",
        window_start=start,
        window_end=start + seconds,
        sent_at=start + seconds,
        node_samples=[(t, cpu, mem) for t in ts],
        system_samples=[(t, cpu / 4, mem // 4) for t in ts],
        **wire.pod_columns(pods, memory_with_page_cache=pod_page_cache),
        **extra,
    )


def _pod(uid: str, start: float, cpu: float, mem: int, *, seconds: int = 10, **ref: Any) -> PodRows:
    return node.PodRef(uid=uid, **ref), [(start + i, cpu, mem) for i in range(seconds)]


def test_pod_identity_priority_and_qos_from_ref() -> None:
    window = NodeWindow(POLICY)
    pods = [
        _pod("u1", 0, 0.5, 100, namespace="ns", name="web", kube_qos="Guaranteed"),
        _pod("u2", 0, 0.25, 200, kube_qos="BestEffort"),
        _pod("u3", 0, 0.1, 300, namespace="ns", name="lbl", labels={"koordinator.sh/priority-class": "koord-mid"}),
    ]
    window.add(_batch(0, pods=pods))
    status = compute_status(window, report_time=10.0, spec=POLICY)
    got = [(p.namespace, p.name, p.uid, p.priority, p.qos, p.pod_usage.resources) for p in status.pods_metric]
    assert got == [
        ("", "u2", "u2", "koord-batch", "BE", {"cpu": 250, "memory": 200}),
        ("ns", "lbl", "u3", "koord-mid", "", {"cpu": 100, "memory": 300}),
        ("ns", "web", "u1", "koord-prod", "LSR", {"cpu": 500, "memory": 100}),
    ]


def test_latest_pod_ref_wins() -> None:
    window = NodeWindow(POLICY)
    window.add(_batch(10, pods=[_pod("u1", 10, 1, 1, namespace="ns", name="new")]))
    window.add(_batch(0, pods=[_pod("u1", 0, 1, 1, namespace="ns", name="old")]))
    assert window.pods["u1"].name == "new"


def test_streaming_window_excludes_its_end() -> None:
    # The sample at exactly T belongs to the batch [T, T+10); whether it has arrived must not change report T.
    early, late = NodeWindow(POLICY), NodeWindow(POLICY)
    for start in range(0, 300, 10):
        early.add(_batch(start, cpu=1.0))
        late.add(_batch(start, cpu=1.0))
    late.add(_batch(300, cpu=9.0))
    assert compute_status(early, report_time=300.0, spec=POLICY) == compute_status(late, report_time=300.0, spec=POLICY)


@pytest.mark.parametrize(
    ("policy", "extra", "memory"),
    [
        ("usageWithoutPageCache", {"memory_with_page_cache": [(5.0, 5000)]}, 1000),
        ("usageWithPageCache", {"memory_with_page_cache": [(5.0, 5000)]}, 5000),
        ("usageWithPageCache", {}, None),  # no page-cache samples: the query fails, nodeUsage stays empty
        ("usageWithHotPageCache", {"memory_with_hot_page": [(5.0, 3000)]}, 3000),
        ("usageWithHotPageCache", {}, 1000),  # collector never ran: falls back to without-page-cache
    ],
)
def test_node_memory_policies(policy: str, extra: dict[str, Any], memory: int | None) -> None:
    spec = node.MetricCollectPolicy(node_memory_collect_policy=policy)
    window = NodeWindow(spec)
    window.add(_batch(0, mem=1000, **extra))
    usage = compute_status(window, report_time=10.0, spec=spec).node_metric.node_usage
    if memory is None:
        assert usage == node.ResourceMap()
    else:
        assert usage.resources == {"cpu": 1000, "memory": memory}


def test_pod_memory_with_page_cache_policy() -> None:
    spec = node.MetricCollectPolicy(node_memory_collect_policy="usageWithPageCache")
    # The page-cache column is all or nothing per batch, so the pod without one arrives in a batch without it.
    with_cache = (node.PodRef(uid="a", namespace="ns", name="a"), [(11.0, 1.0, 100), (12.0, 1.0, 100)])
    without_cache = _pod("b", 0, 1.0, 100, namespace="ns", name="b")
    window = NodeWindow(spec)
    window.add(_batch(0, pods=[without_cache], memory_with_page_cache=[(1.0, 1)]))
    window.add(_batch(10, pods=[with_cache], pod_page_cache=[400, 600], memory_with_page_cache=[(11.0, 1)]))
    pods = compute_status(window, report_time=20.0, spec=spec).pods_metric
    assert [(p.name, p.pod_usage.resources["memory"]) for p in pods] == [("a", 500)]


def test_add_is_idempotent() -> None:
    window = NodeWindow(POLICY)
    first = _batch(0, pods=[_pod("u1", 0, 1.0, 10)])
    assert window.add(first)
    once = compute_status(window, report_time=10.0, spec=POLICY)
    assert not window.add(first)
    assert not window.add(_batch(0, cpu=50.0))  # same window, different content: still the one we hold
    assert compute_status(window, report_time=10.0, spec=POLICY) == once


def test_batches_older_than_every_window_are_dropped() -> None:
    window = NodeWindow(POLICY)
    window.add(_batch(10_000))
    assert not window.add(_batch(0))
    assert window.add(_batch(9_000))


def test_state_stays_bounded_over_10000_batches() -> None:
    window = NodeWindow(POLICY)
    sizes_after_warmup: dict[str, int] = {}
    for k in range(10_000):
        start = k * 10.0
        # 20 pods live at a time, replaced every 100 batches: old pods must be forgotten
        pods = [_pod(f"u{k // 100}-{i}", start, 0.5, 64, namespace="ns", name=f"p{i}") for i in range(20)]
        window.add(_batch(start, pods=pods, memory_with_page_cache=[(start, 1)]))
        if k == 1000:
            sizes_after_warmup = window.capacities()
    assert window.capacities() == sizes_after_warmup
    assert sizes_after_warmup["series"] < 2 * 2000
    assert len(window.pods) <= 40
    status = compute_status(window, report_time=100_000.0, spec=POLICY)
    assert len(status.pods_metric) == 20
    assert all(p.pod_usage.resources == {"cpu": 500, "memory": 64} for p in status.pods_metric)


# --- bucket exactness: streaming vs the calc path at the node's report times


@st.composite
def _node_history(draw: st.DrawFn) -> tuple[list[node.NodeMetricsReported], float, int]:
    """Batch-aligned history, a report phase and the report time the service would compute next (phase + k × 60);
    values are exact binary fractions so sums do not depend on summation order."""
    n_batches = draw(st.integers(min_value=1, max_value=40))
    rnd = draw(st.randoms(use_true_random=False))

    def sample(t: int) -> Sample:
        return (float(t), rnd.randrange(64 * 16) / 64, rnd.randrange(2**40))

    batches = []
    for k in range(n_batches):
        seconds = range(10 * k, 10 * k + 10)
        pods = [
            (
                node.PodRef(uid=uid, namespace="ns", name=uid),
                [sample(t) for t in sorted(rnd.sample(seconds, rnd.randint(1, 10)))],
            )
            for uid in ("a", "b", "c")
            if rnd.random() < 0.7
        ]
        node_samples = [sample(t) for t in seconds]
        batches.append(
            node.NodeMetricsReported(
                node="n1",
                window_start=10.0 * k,
                window_end=10.0 * k + 10,
                sent_at=10.0 * k + 10,
                node_samples=node_samples,
                system_samples=node_samples[::2],
                **wire.pod_columns(pods),
            )
        )
    # The service reports T as soon as a batch reaches it, so T is never a full report interval behind.
    phase = draw(st.sampled_from([0, 10, 20, 30, 40, 50]))
    report_time = float((10 * n_batches - phase) // 60 * 60 + phase)
    assume(report_time > 0)
    return batches, report_time, phase


def _without_uid(status: node.NodeMetricStatus) -> Any:
    data = msgspec.to_builtins(status)
    for pod in data["pods_metric"]:
        pod.pop("uid", None)
    return data


@settings(max_examples=60, deadline=None)
@given(history=_node_history())
def test_pod_buckets_match_raw_samples_at_report_times(
    history: tuple[list[node.NodeMetricsReported], float, int],
) -> None:
    batches, report_time, phase = history
    spec = node.MetricCollectPolicy(aggregate_duration_seconds=60, durations_seconds=(60, 120, 300))
    window = NodeWindow(spec, phase=phase)
    for b in batches:
        window.add(b)

    def before_t(samples: Sequence[Sample]) -> list[Sample]:
        return [s for s in samples if s[0] < report_time]  # the stream's window is [T − w, T)

    listed_now = {ref.uid for ref in batches[-1].pods}
    raw_pods: dict[str, list[Sample]] = {}
    for b in batches:
        for ref, samples in wire.samples_by_pod(b):
            raw_pods.setdefault(ref.uid, []).extend(before_t(samples))
    expected = core.compute_from_samples(
        report_time=report_time,
        spec=spec,
        node_samples=before_t([s for b in batches for s in b.node_samples]),
        system_samples=before_t([s for b in batches for s in b.system_samples]),
        # podsMetric names the pods of the newest batch's list only: the pods on the node now, as koordlet's
        # kubelet list (a pod seen only earlier in the window has left)
        pods=[core.PodSeries("ns", uid, samples) for uid, samples in raw_pods.items() if uid in listed_now],
    )
    got = compute_status(window, report_time=report_time, spec=spec)
    assert _without_uid(got) == _without_uid(expected)


# --- due_report


def test_due_report_sequencing() -> None:
    window = NodeWindow(POLICY)
    assert due_report(window, spec=POLICY) is None
    for start in range(0, 60, 10):
        window.add(_batch(start))
        due = due_report(window, spec=POLICY)
        assert due == (60.0 if start == 50 else None)  # round 0 has no data before it
    window.mark_reported(60.0)
    window.add(_batch(60))
    assert due_report(window, spec=POLICY) is None
    window.add(_batch(300))  # 120, 180 and 240 were missed: only the newest round is due
    assert due_report(window, spec=POLICY) == 300.0
    window.mark_reported(300.0)
    window.mark_reported(240.0)  # marking never moves backwards
    assert window.last_report == 300.0


def test_due_report_uses_effective_interval_and_resumes() -> None:
    fast = node.MetricCollectPolicy(report_interval_seconds=5)
    window = NodeWindow(fast, last_report=60.0)
    window.add(_batch(50))
    assert due_report(window, spec=fast) is None  # 60 was reported before the restart
    window.add(_batch(60))
    window.add(_batch(80))
    assert due_report(window, spec=fast) == 90.0  # 30 s floor, not 5 s


def test_report_phases_are_stable_spread_and_on_batch_boundaries() -> None:
    phases = [core.report_phase(f"node-{i}", interval=60, step=10) for i in range(600)]
    assert phases == [core.report_phase(f"node-{i}", interval=60, step=10) for i in range(600)]
    assert set(phases) == {0, 10, 20, 30, 40, 50}
    assert min(phases.count(p) for p in set(phases)) > 60  # roughly even: no slot gets a burst
    assert core.report_phase("node-1", interval=60, step=0) == 0
    assert core.report_phase("node-1", interval=60, step=7) == 0  # 7 s slots would not fall on batch boundaries


def test_due_report_honours_the_phase() -> None:
    window = NodeWindow(POLICY)
    for start in range(0, 120, 10):
        window.add(_batch(start))
    assert due_report(window, spec=POLICY, phase=30) == 90.0
    window.mark_reported(90.0)
    assert due_report(window, spec=POLICY, phase=30) is None
    window.add(_batch(140))
    assert due_report(window, spec=POLICY, phase=30) == 150.0
