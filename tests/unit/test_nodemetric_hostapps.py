"""hostApplicationMetric from a node's window (issue 22, point 3; spec §1.6 item 6): per host application the
average CPU and memory (per the node memory collect policy) over the aggregate window, with the classes of the
newest batch, sorted by name; state made only for nodes that report host applications, and bounded; and what the
batch calculation then reads of it."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import node, vocab
from schemas.nodemetric_json import snapshot_from_computed
from services.nodemetric.window import NodeWindow, compute_status
from services.noderesource import core as noderesource

POLICY = node.MetricCollectPolicy()  # report every 60 s, averages over 300 s
WITH_PAGE_CACHE = node.MetricCollectPolicy(node_memory_collect_policy="usageWithPageCache")


def app(
    name: str, start: float, *, cpu: float, memory: int, cache: int | None = None, priority: str = "", qos: str = ""
) -> node.HostApplicationSamples:
    return node.HostApplicationSamples(
        name=name,
        samples=[(start + i, cpu, memory) for i in range(10)],
        memory_with_page_cache=[] if cache is None else [cache] * 10,
        priority=priority,  # type: ignore[arg-type]
        qos=qos,  # type: ignore[arg-type]
    )


def batch(start: float, apps: Sequence[node.HostApplicationSamples] = ()) -> node.NodeMetricsReported:
    return node.NodeMetricsReported(
        node="n1",
        window_start=start,
        window_end=start + 10,
        sent_at=start + 10,
        node_samples=[(start + i, 4.0, 10_000) for i in range(10)],
        system_samples=[(start + i, 1.0, 1_000) for i in range(10)],
        host_applications=list(apps),
    )


def host_apps(window: NodeWindow, report_time: float, spec: node.MetricCollectPolicy = POLICY) -> list[tuple]:
    status = compute_status(window, report_time=report_time, spec=spec)
    return [(a.name, a.usage.resources, a.priority, a.qos) for a in status.host_applications]


def test_each_application_is_averaged_over_the_aggregate_window_and_sorted_by_name() -> None:
    window = NodeWindow(POLICY)
    for start in range(0, 300, 10):
        cpu = 1.0 if start < 150 else 2.0  # half the window at 1 core, half at 2
        window.add(
            batch(
                start,
                [
                    app("sshd", start, cpu=0.01, memory=4 << 20, cache=9 << 20),
                    app("nginx", start, cpu=cpu, memory=(1 << 30) + start, priority="koord-prod", qos="LS"),
                ],
            )
        )
    assert host_apps(window, 300.0) == [
        ("nginx", {"cpu": 1500, "memory": (1 << 30) + 145}, "koord-prod", "LS"),  # memory: mean of 0 … 290
        ("sshd", {"cpu": 10, "memory": 4 << 20}, "", ""),  # without page cache by default
    ]
    status = compute_status(window, report_time=300.0, spec=POLICY)
    assert status.node_metric.system_usage.resources == {"cpu": 1000, "memory": 1000}  # the agent's, as sent


def test_memory_follows_the_collect_policy() -> None:
    window = NodeWindow(WITH_PAGE_CACHE)
    for start in range(0, 60, 10):
        window.add(batch(start, [app("a", start, cpu=0.5, memory=100, cache=700), app("b", start, cpu=0.5, memory=5)]))
    # the page-cache variant where the agent sent one; an application without it has no memory under this policy
    assert host_apps(window, 60.0, WITH_PAGE_CACHE) == [("a", {"cpu": 500, "memory": 700}, "", "")]
    hot = node.MetricCollectPolicy(node_memory_collect_policy="usageWithHotPageCache")
    window = NodeWindow(hot)
    window.add(batch(0, [app("a", 0, cpu=0.5, memory=100, cache=700)]))
    assert host_apps(window, 10.0, hot) == [("a", {"cpu": 500, "memory": 100}, "", "")]  # as pods: no hot-page series


def test_the_window_is_the_aggregate_one_and_the_newest_classes_win() -> None:
    window = NodeWindow(POLICY)
    window.add(batch(0, [app("old", 0, cpu=3.0, memory=1)]))
    for start in range(10, 400, 10):
        window.add(batch(start, [app("web", start, cpu=0.5, memory=64, priority="koord-batch", qos="BE")]))
    window.add(batch(400, [app("web", 400, cpu=0.5, memory=64, priority="koord-prod", qos="LSR")]))
    # report 360 covers [60, 360): "old" left it; the classes are the newest batch's
    assert host_apps(window, 360.0) == [("web", {"cpu": 500, "memory": 64}, "koord-prod", "LSR")]
    late = NodeWindow(POLICY)
    late.add(batch(10, [app("web", 10, cpu=0.5, memory=64, priority="koord-prod")]))
    late.add(batch(0, [app("web", 0, cpu=0.5, memory=64, priority="koord-batch")]))  # late: says less than the newest
    assert host_apps(late, 20.0)[0][2] == "koord-prod"


def test_nodes_without_host_applications_keep_nothing_for_them_and_state_stays_bounded() -> None:
    plain = NodeWindow(POLICY)
    for start in range(0, 600, 10):
        plain.add(batch(start))
    assert "host_apps" not in plain.capacities()
    assert compute_status(plain, report_time=600.0, spec=POLICY).host_applications == []

    window = NodeWindow(POLICY)
    sizes: dict[str, int] = {}
    for k in range(3000):
        start = k * 10.0
        # 3 applications at a time, renamed every 100 batches (a NodeSLO that changes): old names are forgotten
        window.add(batch(start, [app(f"app-{k // 100}-{i}", start, cpu=0.1, memory=64) for i in range(3)]))
        if k == 500:
            sizes = window.capacities()
    assert window.capacities() == sizes
    assert sizes["host_app_slots"] <= 6 and sizes["host_apps"] <= 3 * 8 * 2
    assert [a[0] for a in host_apps(window, 30_000.0)] == ["app-29-0", "app-29-1", "app-29-2"]
    for start in range(30_000, 31_000, 10):  # the NodeSLO drops them: the state goes once the samples expire
        window.add(batch(start))
    assert "host_apps" not in window.capacities()


def test_the_batch_calculation_counts_prod_and_mid_applications_as_system_usage() -> None:
    window = NodeWindow(POLICY)
    for start in range(0, 300, 10):
        window.add(
            batch(
                start,
                [
                    app("nginx", start, cpu=2.0, memory=1 << 30, priority=vocab.PRIORITY_PROD),
                    app("cache", start, cpu=1.0, memory=1 << 29, priority=vocab.PRIORITY_MID),
                    app("backup", start, cpu=4.0, memory=1 << 31, priority=vocab.PRIORITY_BATCH),
                ],
            )
        )
    status = compute_status(window, report_time=300.0, spec=POLICY)
    event = node.NodeMetricComputed(node="n1", report_time=300.0, spec=POLICY, status=status)
    snapshot = snapshot_from_computed(event)
    assert [a.name for a in snapshot.host_applications] == ["backup", "cache", "nginx"]
    # spec §2.4: batch counts host applications above koord-batch; §2.8: mid those above koord-mid
    assert noderesource.host_apps_used_above(snapshot, vocab.PRIORITY_BATCH) == {"cpu": 3000, "memory": 3 << 29}
    assert noderesource.host_apps_used_above(snapshot, vocab.PRIORITY_MID) == {"cpu": 2000, "memory": 1 << 30}
