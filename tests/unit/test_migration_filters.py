"""The arbitration filters (spec §4.5): each non-retryable rule and its gate, and each retryable limit."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from schemas import kube, migration
from services.migration import filters
from services.migration.args import MigrationArgs, get_max_unavailable
from tests.support.migration import pod, workload


def args(**given: Any) -> MigrationArgs:
    return msgspec.convert(given, MigrationArgs)


def view(replicas: int = 10, unready: frozenset[str] = frozenset(), a: MigrationArgs | None = None) -> Any:
    a = a or args()
    return filters.WorkloadView(
        uid="rs-1",
        replicas=replicas,
        unready=unready,
        max_migrating=get_max_unavailable(replicas, a.max_migrating_per_workload),
        max_unavailable=get_max_unavailable(replicas, a.max_unavailable_per_workload),
    )


VIEW = view()


def never(p: kube.Pod, a: MigrationArgs | None = None, view: filters.WorkloadView | None = VIEW) -> str | None:
    verdict = filters.non_retryable(
        p, a or args(), view, owner=kube.controller_of(p.metadata), owner_known=view is not None
    )
    return verdict.filter if verdict else None


@pytest.mark.parametrize(
    ("subject", "given", "expected"),
    [
        (pod("ok"), {}, None),
        (pod("veto", annotations={migration.ANNOTATION_EVICTION_COST: str(2**31 - 1)}), {}, "EvictionCost"),
        (pod("bare", owner=None), {}, "BarePods"),
        (pod("bare", owner=None), {"evictAllBarePods": True}, None),
        (pod("bare", owner=None, phase="Failed"), {"evictFailedBarePods": True}, None),
        (pod("bare", owner=None), {"skipEvictionGates": ["BarePods"]}, None),
        (pod("ds", owner_kind="DaemonSet"), {}, "DaemonSet"),
        (pod("crit", priority=2_000_000_000), {}, "SystemCritical"),
        (pod("crit", priorityClassName="system-node-critical"), {}, "SystemCritical"),
        (pod("crit", priority=2_000_000_000), {"evictSystemCriticalPods": True}, None),
        (pod("tmp", volumes=[{"name": "v", "emptyDir": {}}]), {}, "LocalStorage"),
        (pod("tmp", volumes=[{"name": "v", "hostPath": {"path": "/x"}}]), {"evictLocalStoragePods": True}, None),
        (pod("pvc", volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]), {}, None),
        (
            pod("pvc", volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]),
            {"ignorePvcPods": True},
            "PVC",
        ),
        (pod("high", priority=9500), {"priorityThreshold": {"value": 9000}}, "PriorityThreshold"),
        (pod("low", priority=5500), {"priorityThreshold": {"value": 9000}}, None),
        (pod("nolabel"), {"labelSelector": {"matchLabels": {"evictable": "yes"}}}, "LabelSelector"),
        (pod("other", namespace="kube-system"), {"namespaces": {"exclude": ["kube-system"]}}, "Namespaces"),
        (pod("other", namespace="apps"), {"namespaces": {"include": ["web"]}}, "Namespaces"),
        (pod("skip", owner=None, annotations={migration.ANNOTATION_EVICT: ""}), {}, None),
    ],
)
def test_non_retryable_rules(subject: kube.Pod, given: dict[str, Any], expected: str | None) -> None:
    assert never(subject, args(**given)) == expected


@pytest.mark.parametrize(
    ("replicas", "given", "expected"),
    [
        (10, {}, None),
        (1, {}, "ExpectedReplicas"),  # a single replica
        (2, {}, None),  # maxMigrating = maxUnavailable = 1 by default: neither equals 2
        (2, {"skipCheckExpectedReplicas": True}, None),
        (5, {"maxUnavailablePerWorkload": 5}, "ExpectedReplicas"),  # all 5 could be unavailable
        (1, {"skipEvictionGates": ["ExpectedReplicas"]}, None),
    ],
)
def test_expected_replicas(replicas: int, given: dict[str, Any], expected: str | None) -> None:
    a = args(**given)
    assert never(pod("p"), a, view(replicas, a=a)) == expected


def test_an_unknown_workload_is_never_migrated() -> None:
    assert never(pod("p"), view=None) == "ExpectedReplicas"


def migrating_with(*items: tuple[str, kube.Pod]) -> filters.Migrating:
    counts = filters.Migrating()
    for key, p in items:
        counts.add(key, p, p.metadata.namespace, owner=kube.controller_of(p.metadata))
    return counts


def held(p: kube.Pod, counts: filters.Migrating, a: MigrationArgs | None = None, view: Any = VIEW) -> str | None:
    verdict = filters.retryable(
        p, a or args(), counts, view, owner=kube.controller_of(p.metadata), owner_known=view is not None
    )
    return verdict.filter if verdict else None


def test_global_node_and_namespace_limits() -> None:
    others = migrating_with(
        ("default/x", pod("x", node="n1", owner="rs-2")), ("default/y", pod("y", node="n1", owner="rs-3"))
    )
    assert held(pod("p", node="n1"), others) == "MaxMigratingPerNode"  # default 2 per node
    assert held(pod("p", node="n2"), others) is None
    assert held(pod("p", node="n1"), others, args(maxMigratingPerNode=0)) is None  # 0 disables
    assert held(pod("p", node="n2"), others, args(maxMigratingGlobally=2)) == "MaxMigratingGlobally"
    assert held(pod("p", node="n2"), others, args(maxMigratingPerNamespace=2)) == "MaxMigratingPerNamespace"
    assert held(pod("p", node="n2", namespace="apps"), others, args(maxMigratingPerNamespace=2)) is None


def test_workload_migrating_and_unavailable_limits() -> None:
    mates = migrating_with(("default/m1", pod("m1", node="n5")), ("default/m2", pod("m2", node="n6")))
    # 10 replicas: maxMigrating = maxUnavailable = 2 by default
    assert held(pod("p", node="n9"), mates) == "MaxMigratingPerWorkload"
    one = migrating_with(("default/m1", pod("m1", node="n5")))
    assert held(pod("p", node="n9"), one) is None
    unready = view(10, frozenset({"default/sick"}))
    assert held(pod("p", node="n9"), one, view=unready) == "MaxUnavailablePerWorkload"
    assert held(pod("p", node="n9"), one, args(skipEvictionGates=["MaxUnavailablePerWorkload"]), unready) is None
    assert held(pod("p", node="n9"), one, view=None) == "Workload"


def test_workload_views_count_unready_and_terminating_pods() -> None:
    pods = {
        "default/a": pod("a"),
        "default/b": pod("b", ready=False),
        "default/c": pod("c", phase="Succeeded"),
        "default/d": pod("d", owner="other"),
    }
    views = filters.workload_views({"rs-1": workload()}, pods, args())
    assert views["rs-1"].unready == {"default/b", "default/c"}


def test_the_pods_own_jobs_are_left_out_of_every_count() -> None:
    """Spec §4.5: any job of the pod under arbitration (another PMJ for the same pod) counts against no limit; the
    global and per-namespace counts included them before."""
    own_and_one = migrating_with(("default/p", pod("p", node="n1", owner="rs-2")), ("default/x", pod("x", node="n2")))
    assert held(pod("p", node="n1", owner="rs-2"), own_and_one, args(maxMigratingGlobally=2)) is None
    assert held(pod("p", node="n1", owner="rs-2"), own_and_one, args(maxMigratingPerNamespace=2)) is None
    assert held(pod("q", node="n1", owner="rs-2"), own_and_one, args(maxMigratingGlobally=2)) == "MaxMigratingGlobally"
    twice = migrating_with(("default/p", pod("p", node="n1")), ("default/p", pod("p", node="n1")))
    assert held(pod("p", node="n1"), twice, args(maxMigratingGlobally=1, maxMigratingPerNamespace=1)) is None
