"""`koordbus calc low-node-load` / `low-node-load-util` (spec §11): Koordinator's LowNodeLoad test cases rebuilt
with the same node and pod builders (pod metrics = pod requests, as Go's setupNodeMetrics), and one case per rule.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from koordbus.calc import calculate

NOW = "2024-06-01T12:00:00Z"
ONE_ROUND = {"consecutiveAbnormalities": 1, "consecutiveNormalities": 1}


def node(name: str, cpu: int, memory: int, pods: int, **kw: Any) -> dict[str, Any]:
    alloc = {"cpu": f"{cpu}m", "memory": str(memory), "pods": str(pods), **kw.get("extra", {})}
    return {
        "metadata": {"name": name, "labels": kw.get("labels", {}), "annotations": kw.get("annotations", {})},
        "spec": {"unschedulable": kw.get("unschedulable", False), "taints": kw.get("taints")},
        "status": {"capacity": alloc, "allocatable": alloc},
    }


def pod(name: str, cpu: int, memory: int, on: str, owner: str | None = "ReplicaSet", **kw: Any) -> dict[str, Any]:
    requests = {"cpu": f"{cpu}m", "memory": str(memory), **kw.get("extra", {})}
    meta: dict[str, Any] = {
        "namespace": kw.get("namespace", "default"),
        "name": name,
        "labels": kw.get("labels", {}),
        "annotations": kw.get("annotations", {}),
    }
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": owner, "name": "o"}]
    if "created" in kw:
        meta["creationTimestamp"] = kw["created"]
    spec: dict[str, Any] = {"nodeName": on, "containers": [{"name": "c", "resources": {"requests": requests}}]}
    spec.update(kw.get("spec", {}))
    return {"metadata": meta, "spec": spec, "status": kw.get("status", {})}


def metrics_for(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **over: Any) -> list[dict[str, Any]]:
    """One fresh NodeMetric per node whose podsMetric are the pods' requests (or `over[name]`)."""
    out = []
    for n in nodes:
        name = n["metadata"]["name"]
        entries = [
            {
                "namespace": p["metadata"]["namespace"],
                "name": p["metadata"]["name"],
                "podUsage": over.get(
                    p["metadata"]["name"], p["spec"]["containers"][0]["resources"].get("requests", {})
                ),
            }
            for p in pods
            if p["spec"]["nodeName"] == name
        ]
        out.append(
            {
                "metadata": {"name": name},
                "status": {"updateTime": NOW, "nodeMetric": {"nodeUsage": {}}, "podsMetric": entries},
            }
        )
    return out


def standard_pods(**kw: Any) -> list[dict[str, Any]]:
    """p1–p5 evictable on n1, p6 DaemonSet, p7 mirror with local storage, p8 critical, p9 on n2 (Go's test set)."""
    cpu, memory = kw.get("cpu", 400), kw.get("memory", 0)
    pods = [pod(f"p{i}", cpu, memory, "n1", **kw.get(f"p{i}", {})) for i in range(1, 6)]
    pods.append(pod("p6", cpu, memory, "n1", "DaemonSet"))
    mirror = {"kubernetes.io/config.source": "api", "kubernetes.io/config.mirror": "mirror"}
    volumes = [{"name": "s", "hostPath": {"path": "p"}, "emptyDir": {}}]
    pods.append(pod("p7", cpu, memory, "n1", "Pod", annotations=mirror, spec={"volumes": volumes}))
    pods.append(pod("p8", cpu, memory, "n1", None, namespace="kube-system", spec={"priority": 2000000000}))
    pods.append(pod("p9", cpu, kw.get("p9_memory", memory), "n2"))
    return pods


def standard_nodes(n3_unschedulable: bool = True, pods: int = 10, **kw: Any) -> list[dict[str, Any]]:
    return [
        node("n1", 4000, 3000, kw.get("n1_pods", 9 if pods == 10 else pods), **kw.get("n1", {})),
        node("n2", 4000, 3000, pods, **kw.get("n2", {})),
        node("n3", 4000, 3000, pods, unschedulable=n3_unschedulable),
    ]


def run(kind: str, document: dict[str, Any]) -> dict[str, Any]:
    outcome = calculate(kind, json.dumps(document))
    assert outcome.exit_code == 0, outcome.stderr
    result: dict[str, Any] = json.loads(outcome.stdout)
    return result


def balance(args: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    document = {
        "now": NOW,
        "args": {"anomalyCondition": ONE_ROUND, **args},
        "nodes": nodes,
        "nodeMetrics": kw.pop("metrics", None) or metrics_for(nodes, pods),
        "pods": pods,
        **kw,
    }
    return run("low-node-load", document)


def pct(cpu: float, pods: float) -> dict[str, float]:
    return {"cpu": cpu, "pods": pods}


# --- Koordinator's TestLowNodeLoad cases (evicted counts as Go asserts them)


def test_without_priorities_evicts_until_the_budget_is_spent() -> None:
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, standard_nodes(), standard_pods())
    assert out["evicted"] == ["default/p1", "default/p2", "default/p3", "default/p4"]
    assert out["highNodes"] == ["n1"] and out["bothLowNodes"] == ["n2"] and out["lowNodes"] == []
    assert out["evictions"][0]["reason"] == (
        "node is overutilized, node cpu usage(80.00%)>threshold(50.00%), node pods usage(88.89%)>threshold(50.00%)"
    )
    assert out["evictions"][0]["pool"] == "__default_node_pool__"


def test_no_evictable_pods() -> None:
    pods = [pod(f"p{i}", 400, 0, "n1", "DaemonSet") for i in range(1, 5)]
    pods.append(pod("p9", 400, 0, "n2"))
    pods += [pod(f"q{i}", 400, 0, "n1", None) for i in range(4)]
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, standard_nodes(), pods)
    assert out["evictedCount"] == 0


@pytest.mark.parametrize(
    ("namespaces", "expected"),
    [({"exclude": ["default"]}, 3), ({"include": ["default"]}, 2)],
)
def test_evictable_namespaces(namespaces: dict[str, Any], expected: int) -> None:
    other = {"namespace": "other"}
    pods = standard_pods(p3=other, p4=other, p5=other)
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50), "evictableNamespaces": namespaces}
    assert balance(args, standard_nodes(), pods)["evictedCount"] == expected


def test_stop_when_memory_capacity_is_depleted() -> None:
    pods = standard_pods(memory=300, p9_memory=2100)
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, standard_nodes(), pods)
    assert out["evictedCount"] == 3


def test_lower_priority_goes_first() -> None:
    high, low = {"spec": {"priority": 10000}}, {"spec": {"priority": 0}}
    pods = standard_pods(p1=high, p2=high, p3=high, p4=high, p5=low)
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}
    assert balance(args, standard_nodes(), pods)["evictedCount"] == 4  # nodeFit reserved the target for p1–p4
    out = balance({**args, "nodeFit": False}, standard_nodes(), pods)
    assert out["evicted"] == ["default/p5", "default/p1", "default/p2", "default/p3"]


def test_extended_resource_budget() -> None:
    ext = "example.com/foo"
    nodes = standard_nodes(n1={"extra": {ext: "8"}}, n2={"extra": {ext: "8"}})
    pods = standard_pods(cpu=0, **{f"p{i}": {"extra": {ext: "1"}} for i in range(1, 6)})
    for p in pods:
        p["spec"]["containers"][0]["resources"]["requests"][ext] = "1"
    args = {"lowThresholds": {"pods": 30, ext: 30}, "highThresholds": {"pods": 50, ext: 50}}
    assert balance(args, nodes, pods)["evictedCount"] == 3
    nodes = standard_nodes(n1={"extra": {ext: "8"}})
    pods = [pod("p1", 0, 0, "n1", extra={ext: "1"}), pod("p9", 0, 0, "n2")]
    assert balance(args, nodes, pods)["evictedCount"] == 0


def test_only_target_unschedulable_evicts_nothing() -> None:
    nodes = standard_nodes(n2={"unschedulable": True})
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, nodes, standard_pods())
    assert out["evictedCount"] == 0 and out["bothLowNodes"] == []


def test_node_selector_and_affinity_must_match_a_target() -> None:
    selector = {"spec": {"nodeSelector": {"datacenter": "west"}}}
    nodes = standard_nodes(n2={"labels": {"datacenter": "east"}})
    pods = standard_pods(p4=selector, p5=selector)
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}
    assert balance(args, nodes, pods)["evicted"] == ["default/p1", "default/p2", "default/p3"]
    term = {"matchExpressions": [{"key": "datacenter", "operator": "In", "values": ["west"]}]}
    affinity = {
        "spec": {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            }
        }
    }
    pods = standard_pods(p4=affinity, p5=affinity)
    assert balance(args, nodes, pods)["evicted"] == ["default/p1", "default/p2", "default/p3"]


def test_untolerated_taint_refuses_the_target() -> None:
    nodes = standard_nodes(n2={"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]})
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}
    assert balance(args, nodes, standard_pods())["evictedCount"] == 0
    tolerated = {"spec": {"tolerations": [{"key": "k", "operator": "Exists"}]}}
    assert balance(args, nodes, standard_pods(p1=tolerated))["evicted"] == ["default/p1"]


def test_deviation_thresholds() -> None:
    args = {"lowThresholds": pct(5, 5), "highThresholds": pct(5, 5), "useDeviationThresholds": True}
    assert balance(args, standard_nodes(), standard_pods())["evictedCount"] == 2


BATCH = {"labels": {"koordinator.sh/priority-class": "koord-batch"}}


def test_node_under_but_prod_over() -> None:
    args = {
        "lowThresholds": pct(30, 30),
        "highThresholds": pct(90, 90),
        "prodLowThresholds": pct(20, 20),
        "prodHighThresholds": pct(40, 40),
    }
    out = balance(args, standard_nodes(), standard_pods(p3=BATCH, p4=BATCH, p5=BATCH))
    assert out["evictedCount"] == 2 and out["prodHighNodes"] == ["n1"]
    assert all(e["prod"] for e in out["evictions"])
    assert out["evictions"][0]["reason"].startswith("node is overutilized, prod cpu usage(")


def test_both_over_only_node_usage_is_evicted() -> None:
    args = {
        "lowThresholds": pct(30, 30),
        "highThresholds": pct(70, 80),
        "prodLowThresholds": pct(20, 20),
        "prodHighThresholds": pct(40, 40),
    }
    out = balance(args, standard_nodes(), standard_pods(p4=BATCH, p5=BATCH))
    assert out["evictedCount"] == 1 and out["highNodes"] == ["n1"] and out["prodHighNodes"] == []
    assert out["evicted"] == ["default/p4"]  # batch before prod (PodSorter)


def test_prod_only() -> None:
    args = {
        "lowThresholds": pct(0, 0),
        "highThresholds": pct(100, 100),
        "prodLowThresholds": pct(30, 30),
        "prodHighThresholds": pct(50, 50),
    }
    assert balance(args, standard_nodes(), standard_pods())["evictedCount"] == 4


def test_both_low_shared_by_high_and_prod_high_nodes() -> None:
    pods = standard_pods()
    pods[5:5] = [pod("p16", 400, 0, "n1"), pod("p17", 400, 0, "n1")]
    pods += [pod(f"p{i}", 400, 0, "n3") for i in range(10, 16)]
    args = {
        "lowThresholds": pct(30, 50),
        "highThresholds": pct(60, 80),
        "prodLowThresholds": pct(20, 30),
        "prodHighThresholds": pct(30, 50),
    }
    nodes = standard_nodes(False, 20)
    assert balance(args, nodes, pods)["evictedCount"] == 5


def test_deviation_prod_rebalance() -> None:
    pods = [*standard_pods(), pod("p10", 400, 0, "n3"), pod("p11", 400, 0, "n3")]
    args = {
        "useDeviationThresholds": True,
        "lowThresholds": pct(0, 0),
        "highThresholds": pct(100, 100),
        "prodLowThresholds": pct(10, 10),
        "prodHighThresholds": pct(10, 10),
    }
    assert balance(args, standard_nodes(False, 20), pods)["evictedCount"] == 3


def test_max_pods_to_evict_total_and_dry_run() -> None:
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}
    limits = {"maxNoOfPodsToEvictTotal": 1}
    assert balance(args, standard_nodes(), standard_pods(), limits=limits)["evictedCount"] == 1
    out = balance({**args, "dryRun": True}, standard_nodes(), standard_pods(), limits=limits)
    assert out["evictedCount"] == 4  # limits do not apply in dry run, accounting still does
    per_node = balance(args, standard_nodes(), standard_pods(), limits={"maxNoOfPodsToEvictPerNode": 2})
    assert per_node["evictedCount"] == 2


# --- gates, args, pools


def test_paused_does_nothing() -> None:
    out = balance(
        {"paused": True, "lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, standard_nodes(), standard_pods()
    )
    assert out["evictedCount"] == 0 and out["highNodes"] == [] and out["pools"] == []


def test_number_of_nodes_gate() -> None:
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50), "numberOfNodes": 1}
    out = balance(args, standard_nodes(), standard_pods())
    assert out["evictedCount"] == 0 and out["abnormalNodes"] == ["n1"]


def test_default_anomaly_condition_needs_several_rounds() -> None:
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50), "anomalyCondition": None}
    document = {"now": NOW, "args": args, "nodes": standard_nodes(), "pods": standard_pods()}
    document["nodeMetrics"] = metrics_for(document["nodes"], document["pods"])
    out = run("low-node-load", document)
    assert out["evictedCount"] == 0 and out["abnormalNodes"] == []
    assert out["anomalyState"] == {"n1": {"state": "ok", "abnormal": 1, "normal": 0}}
    document["anomalyState"] = {"n1": {"state": "ok", "abnormal": 5}}
    out = run("low-node-load", document)
    assert out["abnormalNodes"] == ["n1"] and out["evictedCount"] == 4
    assert out["anomalyState"]["n1"] == {
        "state": "anomaly",
        "abnormal": 0,
        "normal": 1,
        "anomalyUntil": "2024-06-01T12:01:00Z",
    }


def test_stale_or_missing_node_metric_skips_the_node() -> None:
    nodes, pods = standard_nodes(), standard_pods()
    metrics = metrics_for(nodes, pods)
    metrics[1]["status"]["updateTime"] = "2024-06-01T11:57:00Z"  # exactly 180 s old
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, nodes, pods, metrics=metrics)
    assert out["bothLowNodes"] == [] and out["evictedCount"] == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"numberOfNodes": -1}, "numberOfNodes"),
        ({"nodeMetricExpirationSeconds": 0}, "nodeMetricExpiredSeconds"),
        ({"evictableNamespaces": {"include": ["a"], "exclude": ["b"]}}, "Include/Exclude"),
        ({"lowThresholds": {"cpu": 60}, "highThresholds": {"cpu": 50}}, "lowThresholds[cpu]"),
        ({"highThresholds": {"cpu": 50}, "prodHighThresholds": {"cpu": 60}}, "ProdHighThresholds[cpu]"),
        ({"prodLowThresholds": {"cpu": 60}, "prodHighThresholds": {"cpu": 50}}, "ProdLowThresholds[cpu]"),
        ({"highThresholds": {"cpu": -1}}, "highThresholds[cpu]"),
        ({"anomalyCondition": {"consecutiveAbnormalities": 0, "consecutiveNormalities": 0}}, "consecutiveNormalities"),
        (
            {"nodePools": [{"name": "x", "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Bad"}]}}]},
            "nodePools[1]",
        ),
        (
            {"podSelectors": [{"name": "s", "selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]},
            "podSelectors[0]",
        ),
    ],
)
def test_invalid_args_are_an_error(args: dict[str, Any], needle: str) -> None:
    document = {"now": NOW, "args": args, "nodes": [], "nodeMetrics": [], "pods": []}
    out = run("low-node-load", document)
    assert list(out) == ["error"] and needle in out["error"]


def test_pool_inherits_and_skips_processed_sources() -> None:
    nodes = standard_nodes(n1={"labels": {"pool": "a"}}, n2={"labels": {"pool": "a"}})
    args = {
        "lowThresholds": pct(30, 30),
        "highThresholds": pct(50, 50),
        "nodePools": [{"name": "a", "nodeSelector": {"matchLabels": {"pool": "a"}}}],
    }
    out = balance(args, nodes, standard_pods())
    assert [p["name"] for p in out["pools"]] == ["__default_node_pool__", "a"]
    assert out["pools"][1]["nodes"] == ["n2"]  # n1 was a source of the default pool
    assert out["evictedCount"] == 4


def test_pod_selectors_restrict_candidates() -> None:
    labelled = {"labels": {"app": "x"}}
    args = {
        "lowThresholds": pct(30, 30),
        "highThresholds": pct(50, 50),
        "podSelectors": [{"name": "x", "selector": {"matchLabels": {"app": "x"}}}],
    }
    out = balance(args, standard_nodes(), standard_pods(p2=labelled, p5=labelled))
    assert out["evicted"] == ["default/p2", "default/p5"]


def test_evict_annotation_overrides_protections_and_node_fit_off() -> None:
    pods = standard_pods()
    pods[5]["metadata"]["annotations"] = {"descheduler.alpha.kubernetes.io/evict": "true"}  # the DaemonSet pod
    pods.insert(0, pods.pop(5))
    args = {"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}
    assert "default/p6" in balance(args, standard_nodes(), pods)["evicted"]
    out = balance({**args, "nodeFit": False}, standard_nodes(), standard_pods())
    assert out["evictedCount"] == 4  # the budget still stops it


def test_malformed_input_exits_2() -> None:
    outcome = calculate(
        "low-node-load",
        json.dumps(
            {
                "now": NOW,
                "nodes": [node("n", 1, 1, 1)] * 0,
                "pods": [],
                "nodeMetrics": [{"metadata": {"name": "n"}, "status": {"podsMetric": [{"podUsage": {"cpu": "x"}}]}}],
            }
        ),
    )
    assert outcome.exit_code == 2 and "$.nodeMetrics[0].status.podsMetric[0].podUsage.cpu" in outcome.stderr
    outcome = calculate("low-node-load", json.dumps({"now": NOW, "args": {"lowThresholds": {"cpu": "a"}}}))
    assert outcome.exit_code == 2 and "$.args.lowThresholds" in outcome.stderr


# --- low-node-load-util


ALLOC_NODE = {
    "metadata": {
        "name": "test-node",
        "annotations": {"node.koordinator.sh/raw-allocatable": '{"cpu":96,"memory":"512Gi"}'},
    },
    "status": {"allocatable": {"cpu": "96", "memory": "512Gi"}},
}


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [(None, {"cpu": 32000}), ('{"cpu":"8"}', {"cpu": 8000}), ("not json", {"cpu": 32000}), ("null", {"cpu": 32000})],
)
def test_raw_allocatable(annotation: str | None, expected: dict[str, int]) -> None:
    annotations = {} if annotation is None else {"node.koordinator.sh/raw-allocatable": annotation}
    n = {"metadata": {"annotations": annotations}, "status": {"allocatable": {"cpu": "32"}}}
    assert run("low-node-load-util", {"op": "rawAllocatable", "node": n}) == {"allocatable": expected}


def test_resource_usage_percentages() -> None:
    out = run(
        "low-node-load-util",
        {"op": "resourceUsagePercentages", "node": ALLOC_NODE, "usage": {"cpu": "48", "pods": "3"}},
    )
    assert out == {"percentages": {"cpu": 50.0}}


@pytest.mark.parametrize(
    ("prod", "usage", "want"),
    [
        (False, {"cpu": "64", "memory": "32Gi"}, "node is overutilized, node cpu usage(66.67%)>threshold(50.00%)"),
        (
            False,
            {"cpu": "64", "memory": "400Gi"},
            "node is overutilized, node cpu usage(66.67%)>threshold(50.00%), "
            "node memory usage(78.12%)>threshold(50.00%)",
        ),
        (True, {"cpu": "45", "memory": "200Gi"}, "node is overutilized, prod cpu usage(46.88%)>threshold(40.00%)"),
    ],
)
def test_eviction_reason(prod: bool, usage: dict[str, str], want: str) -> None:
    document = {
        "op": "evictionReason",
        "node": ALLOC_NODE,
        "highThresholds": {"cpu": 50, "memory": 50},
        "prodHighThresholds": {"cpu": 40, "memory": 40},
        "prod": prod,
        "usage": usage,
        "prodUsage": usage,
    }
    assert run("low-node-load-util", document)["reason"] == want


def test_sort_nodes_ascending() -> None:
    def entry(name: str, cpu: str) -> dict[str, Any]:
        return {"node": {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "32"}}}, "usage": {"cpu": cpu}}

    document = {
        "op": "sortNodesByUsage",
        "nodes": [entry("a", "3"), entry("b", "1"), entry("c", "3")],
        "resourceWeights": {"cpu": 1},
    }
    assert run("low-node-load-util", {**document, "ascending": True})["order"] == ["b", "a", "c"]
    assert run("low-node-load-util", document)["order"] == ["a", "c", "b"]


def test_sort_pods_by_class_then_usage_then_age() -> None:
    pods = [
        pod("prod-small", 100, 0, "n"),
        pod("batch", 100, 0, "n", labels={"koordinator.sh/priority-class": "koord-batch"}),
        pod("prod-big", 900, 0, "n"),
        pod("prod-nometric", 100, 0, "n"),
        pod("prod-small-new", 100, 0, "n", created="2024-01-02T00:00:00Z"),
    ]
    metrics = [
        {"namespace": "default", "name": n, "podUsage": {"cpu": c}}
        for n, c in [("prod-small", "100m"), ("batch", "100m"), ("prod-big", "900m"), ("prod-small-new", "100m")]
    ]
    document = {
        "op": "sortPods",
        "node": {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "4"}}},
        "usage": {"cpu": "3", "memory": "1"},
        "highThresholds": {"cpu": "2", "memory": "10"},
        "podMetrics": metrics,
        "pods": pods,
        "resourceWeights": {"cpu": 1, "memory": 1},
    }
    order = run("low-node-load-util", document)["order"]
    assert order == [
        "default/batch",
        "default/prod-big",
        "default/prod-small-new",
        "default/prod-small",
        "default/prod-nometric",
    ]


def test_pod_fits_any_node_keeps_the_reservation_and_reverts_a_miss() -> None:
    nodes = [node("full", 4000, 3000, 10), node("free", 4000, 3000, 10)]
    document = {
        "op": "podFitsAnyNode",
        "pod": pod("p", 100, 0, "src"),
        "nodes": nodes,
        "pods": [],
        "nodeUsages": {"full": {"cpu": "1900m", "memory": "0"}, "free": {"cpu": "0", "memory": "0"}},
        "nodeThresholds": {"full": {"cpu": "2", "memory": "10"}, "free": {"cpu": "2", "memory": "10"}},
        "podMetric": {"cpu": "200m", "memory": "5"},
    }
    out = run("low-node-load-util", document)
    assert out == {"fits": True, "nodeUsages": {"full": {"cpu": 1900, "memory": 0}, "free": {"cpu": 200, "memory": 5}}}
    document["nodeUsages"]["free"] = {"cpu": "1900m"}
    assert run("low-node-load-util", document)["fits"] is False


def test_filter_nodes() -> None:
    nodes = [{"metadata": {"name": "a", "labels": {"x": "1"}}}, {"metadata": {"name": "b"}}]
    util = "low-node-load-util"
    assert run(util, {"op": "filterNodes", "nodeSelector": None, "nodes": nodes, "processed": ["a"]})["nodes"] == [
        "a",
        "b",
    ]
    assert run(util, {"op": "filterNodes", "nodeSelector": {}, "nodes": nodes, "processed": ["a"]})["nodes"] == ["b"]
    selector = {"matchLabels": {"x": "1"}}
    assert run(util, {"op": "filterNodes", "nodeSelector": selector, "nodes": nodes})["nodes"] == ["a"]
    bad = {"matchExpressions": [{"key": "x", "operator": "Exists", "values": ["1"]}]}
    assert "error" in run(util, {"op": "filterNodes", "nodeSelector": bad, "nodes": nodes})


def test_anomaly_detector_steps() -> None:
    def steps(abnormalities: int, *ops: tuple[str, list[str]]) -> list[dict[str, Any]]:
        document = {
            "op": "anomaly",
            "anomalyCondition": {"consecutiveAbnormalities": abnormalities, "consecutiveNormalities": 1},
            "steps": [{"op": op, "nodes": names} for op, names in ops],
        }
        results: list[dict[str, Any]] = run("low-node-load-util", document)["results"]
        return results

    assert steps(1, ("filter", ["a"])) == [{"abnormalNodes": ["a"], "states": {}}]
    assert steps(2, ("filter", ["a"]), ("filter", ["a"]))[1]["abnormalNodes"] == []
    third = steps(2, ("filter", ["a"]), ("filter", ["a"]), ("filter", ["a", "b"]))[2]
    assert third == {"abnormalNodes": ["a"], "states": {"a": "anomaly", "b": "ok"}}
    marked = steps(1 + 0, ("filter", ["a"]))
    assert marked[0]["states"] == {}
    out = steps(0, ("filter", ["a"]), ("markNormal", ["a"]), ("markNormal", ["a"]))
    assert [r["states"]["a"] for r in out] == ["anomaly", "anomaly", "ok"]
    out = steps(0, ("filter", ["a"]), ("reset", ["a"]))
    assert out[1] == {"states": {"a": "ok"}}


# --- the pure helpers


def test_new_thresholds_fill_the_shared_maps_as_go_does() -> None:
    from services.migration.lownodeload_balance import new_thresholds

    top_low, top_high = {"cpu": 30.0}, {"cpu": 50.0}
    low, high, prod_low, prod_high, names = new_thresholds(False, top_low, top_high, None, None)
    assert low is top_low and high is top_high and names == ["cpu", "memory"]
    assert top_high == {"cpu": 50.0, "memory": 100.0} and prod_low == prod_high == {"cpu": 100.0, "memory": 100.0}
    # A later pool with its own low map but the inherited high map overwrites the shared high for cpu.
    _, high, _, _, names = new_thresholds(False, {"pods": 30.0}, top_high, None, None)
    assert top_high["cpu"] == 100.0 and sorted(names) == ["cpu", "memory", "pods"]
    low, high, _, _, _ = new_thresholds(True, None, None, None, None)
    assert low == high == {"memory": 0.0}


def test_absolute_thresholds_truncate_in_float64() -> None:
    from fractions import Fraction

    from services.migration.lownodeload_util import absolute_threshold

    assert absolute_threshold({"cpu": Fraction(4)}, "cpu", 70) == Fraction(2800, 1000)
    assert absolute_threshold({"pods": Fraction(9)}, "pods", 50) == 4
    assert absolute_threshold({"memory": Fraction(3)}, "memory", 33.4) == 1
    assert absolute_threshold({}, "memory", 50) == 0


def test_scores() -> None:
    from fractions import Fraction

    from services.migration.lownodeload_util import node_usage_score, pod_usage_score

    alloc = {"cpu": Fraction(32), "pods": Fraction(110)}
    usage = {"cpu": Fraction(40), "pods": Fraction(25)}  # cpu above alloc counts as alloc
    assert node_usage_score(usage, alloc, {"cpu": 1, "pods": 1}) == (1000 + 227) // 2
    assert node_usage_score(usage, alloc, {}) == 0
    exceeding = {"cpu": Fraction(1)}
    assert pod_usage_score({"cpu": Fraction(1, 2), "memory": Fraction(5)}, exceeding, {"cpu": 1}) == 0.5
    assert pod_usage_score({"cpu": Fraction(4)}, exceeding, {"cpu": 2}) == 1.25


def test_deviation_thresholds_follow_the_pool_mean() -> None:
    nodes = standard_nodes(False)
    pods = [pod("a1", 1000, 0, "n1"), pod("a2", 1000, 0, "n1"), pod("b", 400, 0, "n2")]
    args = {"lowThresholds": {"cpu": 10}, "highThresholds": {"cpu": 10}, "useDeviationThresholds": True}
    out = balance(args, nodes, pods)
    # mean cpu = (50 + 10 + 0) / 3 = 20 %: high = 30 %, low = 10 %; n1 is high, n2 and n3 low.
    assert out["highNodes"] == ["n1"] and out["bothLowNodes"] == ["n2", "n3"]
    assert out["evictions"] == [
        {
            "pod": "default/a1",
            "node": "n1",
            "prod": False,
            "pool": "__default_node_pool__",
            "reason": "node is overutilized, node cpu usage(50.00%)>threshold(10.00%)",
        }
    ]  # a1 fits n3 only (n2 would go above 30 %); then n1 is at 25 %, under its high threshold


def test_raw_allocatable_annotation_sets_the_thresholds() -> None:
    annotations = {"node.koordinator.sh/raw-allocatable": '{"cpu": 2, "memory": "3000", "pods": 9}'}
    nodes = standard_nodes(n1={"annotations": annotations})
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, nodes, standard_pods())
    assert out["evictions"][0]["reason"].startswith("node is overutilized, node cpu usage(160.00%)>threshold(50.00%)")


def test_help_examples_run() -> None:
    from koordbus.calc import CALCULATORS

    assert run("low-node-load", json.loads(CALCULATORS["low-node-load"].example))["evicted"] == ["ns/web"]
    util_example = json.loads(CALCULATORS["low-node-load-util"].example)
    assert run("low-node-load-util", util_example) == {"allocatable": {"cpu": 8000}}


def test_a_resource_without_allocatable_on_the_targets_leaves_no_budget() -> None:
    nodes = standard_nodes()
    for n in nodes:
        del n["status"]["allocatable"]["memory"]  # memory is always in the resource set: its budget is 0
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, nodes, standard_pods())
    assert out["highNodes"] == ["n1"] and out["evictedCount"] == 0


def test_node_affinity_terms() -> None:
    from schemas.scheduling import SchedulingNode, SchedulingPod, pod_matches_node_labels

    def fits(*terms: dict[str, Any], selector: dict[str, str] | None = None) -> bool:
        required = {"nodeSelectorTerms": list(terms)}
        spec = {
            "nodeSelector": selector,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
        }
        target = SchedulingNode(metadata=kube_meta("n1", {"zone": "a", "gen": "5"}))
        return pod_matches_node_labels(msgspec.convert({"spec": spec}, SchedulingPod), target)

    def expr(key: str, op: str, *values: str) -> dict[str, Any]:
        return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}

    assert fits(expr("zone", "In", "a"))
    assert not fits(expr("zone", "In", "a"), selector={"zone": "b"})
    assert fits(expr("zone", "In", "b"), expr("gen", "Gt", "4"))  # terms are ORed
    assert not fits(expr("gen", "Lt", "5")) and not fits()  # no term matches nothing
    assert not fits(expr("zone", "In")) and not fits(expr("zone", "Exists", "a"))  # invalid terms match nothing
    assert fits({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
    assert not fits({})


def kube_meta(name: str, labels: dict[str, str]) -> Any:
    from schemas import kube

    return kube.ObjectMeta(name=name, labels=labels)


def test_best_effort_pods_go_first() -> None:
    pods = standard_pods()
    for p in (pods[0], pods[1], pods[3], pods[4]):
        p["spec"]["containers"][0]["resources"] = {}  # BestEffort: no requests, so an empty metric
    out = balance({"lowThresholds": pct(30, 30), "highThresholds": pct(50, 50)}, standard_nodes(), pods)
    assert out["evicted"] == ["default/p1", "default/p2", "default/p4", "default/p5"]
