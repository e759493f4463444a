"""PSI in a node's window (issue 23, point 6): the node's and each pod's average stall ratios over the aggregate
window, published beside the NodeMetric status (NodeMetricComputed.psi) and kept out of the NodeMetric object, which
still validates against Koordinator's CRD; state made only for nodes that report PSI, and dropped when it expires."""

from __future__ import annotations

import msgspec
import pytest

from schemas import koordinator, node
from schemas.psi import PodPsiColumns, PsiAverages, PsiSample
from services.k8s import writes
from services.nodemetric.window import NodeWindow, compute_status
from tests.support.crd import assert_valid_nodemetric

POLICY = node.MetricCollectPolicy()  # report every 60 s, averages over 300 s
PODS = [
    node.PodRef(uid="u-web", kube_qos="Burstable", namespace="shop", name="web"),
    node.PodRef(uid="u-etl", kube_qos="BestEffort", namespace="batch", name="etl"),
    node.PodRef(uid="u-quiet", kube_qos="Burstable", namespace="shop", name="quiet"),
]


def batch(start: float, *, node_cpu: float | None, web_cpu: float, etl_io: float | None) -> node.NodeMetricsReported:
    t = [start + i for i in range(10)]
    pod_psi = [(0, PsiSample(t=x, cpu_some=web_cpu, cpu_full=web_cpu / 2)) for x in t]
    if etl_io is not None:
        pod_psi += [(1, PsiSample(t=x, io_some=etl_io)) for x in t]
    return node.NodeMetricsReported(
        node="n1",
        window_start=start,
        window_end=start + 10,
        sent_at=start + 10,
        node_samples=[(x, 4.0, 10_000) for x in t],
        system_samples=[(x, 1.0, 1_000) for x in t],
        pods=PODS,
        pod_samples=node.PodSampleColumns.of(
            pod=[i for i in range(3) for _ in t], t=t * 3, cpu=[0.5] * 30, memory=[1 << 20] * 30
        ),
        node_psi=[] if node_cpu is None else [PsiSample(t=x, cpu_some=node_cpu, memory_some=0.0) for x in t],
        pod_psi=PodPsiColumns.of(pod_psi),
    )


def test_averages_over_the_aggregate_window_for_the_node_and_each_pod() -> None:
    window = NodeWindow(POLICY)
    for start in range(0, 360, 10):
        # [0, 60) falls outside the report at 360's window [60, 360): its 0.9 must not count
        web = 0.9 if start < 60 else (0.1 if start < 210 else 0.3)
        window.add(batch(start, node_cpu=0.2, web_cpu=web, etl_io=0.05 if start >= 300 else None))
    metric = window.psi_metric(360.0)
    assert metric is not None
    assert metric.node == PsiAverages(cpu_some=pytest.approx(0.2), memory_some=0.0)  # a true zero stays; io absent
    pods = {(p.namespace, p.name): p for p in metric.pods}
    assert list(pods) == [("batch", "etl"), ("shop", "web")]  # sorted; the pod without PSI is left out
    assert pods[("shop", "web")].uid == "u-web"
    assert pods[("shop", "web")].averages.cpu_some == pytest.approx(0.2)  # half at 0.1, half at 0.3
    assert pods[("shop", "web")].averages.cpu_full == pytest.approx(0.1)
    assert pods[("shop", "web")].averages.io_some is None
    assert pods[("batch", "etl")].averages == PsiAverages(io_some=pytest.approx(0.05))


def test_a_node_without_psi_publishes_none_and_keeps_no_psi_state() -> None:
    window = NodeWindow(POLICY)
    plain = msgspec.structs.replace(batch(0, node_cpu=None, web_cpu=0.0, etl_io=None), pod_psi=PodPsiColumns())
    window.add(plain)
    assert window.psi_metric(60.0) is None
    assert not any(name.startswith("psi") for name in window.capacities())


def test_psi_state_goes_when_its_last_bucket_expires() -> None:
    window = NodeWindow(POLICY)
    window.add(batch(0, node_cpu=0.2, web_cpu=0.1, etl_io=0.1))
    assert "psi_node" in window.capacities()
    for start in range(10, 1000, 10):
        window.add(
            msgspec.structs.replace(batch(start, node_cpu=None, web_cpu=0.0, etl_io=None), pod_psi=PodPsiColumns())
        )
    assert "psi_node" not in window.capacities()
    assert window.psi_metric(1000.0) is None


def test_pod_psi_of_an_unknown_pod_list_is_dropped() -> None:
    window = NodeWindow(POLICY)
    unknown = msgspec.structs.replace(batch(0, node_cpu=0.3, web_cpu=0.5, etl_io=None), pods=[], pods_digest=42)
    window.add(unknown)
    metric = window.psi_metric(60.0)
    assert metric is not None and metric.node is not None and metric.pods == []


def test_the_nodemetric_object_written_stays_valid_and_carries_no_psi() -> None:
    window = NodeWindow(POLICY)
    for start in range(0, 300, 10):
        window.add(batch(start, node_cpu=0.2, web_cpu=0.1, etl_io=0.05))
    event = node.NodeMetricComputed(
        node="n1",
        report_time=300.0,
        spec=POLICY,
        status=compute_status(window, report_time=300.0, spec=POLICY),
        psi=window.psi_metric(300.0),
    )
    assert event.psi is not None and event.psi.pods
    decoded = msgspec.json.decode(msgspec.json.encode(event), type=node.NodeMetricComputed)
    assert decoded.psi == event.psi  # on the bus, koordbus's own field
    current = writes.nodemetric_to_create(event)
    current["metadata"]["resourceVersion"] = "1"
    updated = writes.nodemetric_status_update(current, event)
    assert updated is not None
    assert_valid_nodemetric(updated)
    assert "psi" not in msgspec.json.encode(updated).decode().lower()
    assert koordinator.nodemetric_status_to_json(event.status, quantities=True) == updated["status"]


def test_a_ratio_missing_from_some_samples_is_averaged_over_those_that_have_it() -> None:
    window = NodeWindow(POLICY)
    plain = batch(0, node_cpu=None, web_cpu=0.0, etl_io=None)
    samples = [PsiSample(t=float(i), cpu_some=0.1, cpu_full=None if i % 2 else 0.4) for i in range(10)]
    window.add(msgspec.structs.replace(plain, node_psi=samples, pod_psi=PodPsiColumns()))
    metric = window.psi_metric(60.0)
    assert metric is not None and metric.node is not None and metric.pods == []
    assert metric.node.cpu_some == pytest.approx(0.1)
    assert metric.node.cpu_full == pytest.approx(0.4)  # over the 5 samples that have it, not 10
