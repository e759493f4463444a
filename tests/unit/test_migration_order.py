"""The arbitration order (spec §4.4): each PodSorter key, and the four stable job sorts with the last dominating."""

from __future__ import annotations

import pytest

from schemas import kube, migration
from services.migration import order
from tests.support.migration import job, pod


def ordered(*pods: kube.Pod) -> list[str]:
    return [p.metadata.name for p in sorted(pods, key=order.pod_sort_key)]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (pod("free", priority=3500), pod("batch", priority=5500)),  # koord priority class Free < Batch
        (pod("mid", priority=7500), pod("none", priority=None)),  # Mid < no class
        (pod("low", priority=9100), pod("high", priority=9200)),  # both Prod: spec.priority
        (
            pod("be", labels={"koordinator.sh/qosClass": "BE"}),
            pod("ls", labels={"koordinator.sh/qosClass": "LS"}),
        ),  # koord QoS BE < LS
        (
            pod("lsr", labels={"koordinator.sh/qosClass": "LSR"}),
            pod("plain"),
        ),  # LSR < no koord QoS
        (
            pod("cheap", annotations={migration.ANNOTATION_DELETION_COST: "-5"}),
            pod("dear", annotations={migration.ANNOTATION_DELETION_COST: "5"}),
        ),
        (
            pod("cost1", annotations={migration.ANNOTATION_EVICTION_COST: "1"}),
            pod("cost9", annotations={migration.ANNOTATION_EVICTION_COST: "9"}),
        ),
        (pod("newer", created="2026-01-01T11:00:00Z"), pod("older", created="2026-01-01T09:00:00Z")),
    ],
)
def test_each_pod_sorter_key_puts_the_cheaper_eviction_first(first: kube.Pod, second: kube.Pod) -> None:
    assert ordered(second, first) == [first.metadata.name, second.metadata.name]


def test_kube_qos_orders_best_effort_before_guaranteed() -> None:
    guaranteed = pod(
        "g",
        containers=[
            {
                "name": "c",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            }
        ],
    )
    burstable = pod("b", containers=[{"name": "c", "resources": {"requests": {"cpu": "1"}}}])
    best_effort = pod("e")
    assert ordered(guaranteed, burstable, best_effort) == ["e", "b", "g"]


def test_jobs_by_creation_then_pod_then_batch_owner_then_migrating_count() -> None:
    pods = {
        "a": pod("a", priority=5500),  # batch class: evicted before the prod pods
        "b": pod("b", priority=9500),
        "c": pod("c", priority=9100, owner="job-x", owner_kind="Job"),
        "d": pod("d", priority=9900, owner="job-x", owner_kind="Job"),
        "e": pod("e", priority=9000, owner="job-y", owner_kind="Job"),
    }
    jobs = [job(f"j-{name}", name) for name in pods] + [job("j-missing", "ghost")]

    job_pods = {j.metadata.name: pods.get(j.spec.pod_ref.name if j.spec.pod_ref else "") for j in jobs}
    owners = {
        name: order.batch_job_owner(kube.controller_of(p.metadata)) if p is not None else None
        for name, p in job_pods.items()
    }
    keys = {name: order.pod_sort_key(p) if p is not None else None for name, p in job_pods.items()}
    names = [j.metadata.name for j in order.sort_jobs(jobs, keys, owners, {})]
    # the missing pod first; then the PodSorter order, with j-d pulled next to j-c (same batch Job)
    assert names == ["j-missing", "j-a", "j-e", "j-c", "j-d", "j-b"]
    names = [j.metadata.name for j in order.sort_jobs(jobs, keys, owners, {"job-x": 3})]
    assert names[:2] == ["j-c", "j-d"]  # job-x already has pods migrating: its jobs go first


def test_newer_jobs_first_when_the_pods_tie() -> None:
    twins = {"p": pod("p"), "q": pod("q")}
    older, newer = job("older", "p", created="2026-01-01T11:00:00Z"), job("newer", "q", created="2026-01-01T11:30:00Z")
    keys = {"older": order.pod_sort_key(twins["p"]), "newer": order.pod_sort_key(twins["q"])}
    result = order.sort_jobs([older, newer], keys, {}, {})
    assert [j.metadata.name for j in result] == ["newer", "older"]
