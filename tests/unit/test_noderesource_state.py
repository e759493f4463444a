"""services.noderesource.state: which nodes each event touches, ordering and tombstones, and the per-node decision.

The node, pods and NodeMetric are the §2.6 worked example (100 cores / 400 GiB, kubelet reserves 2 cores / 8 GiB,
system uses 3 cores / 10 GiB; prod pod A asks 40c/100Gi and uses 10c/60Gi, prod pod B asks 20c/40Gi with no metric,
a dangling prod metric C uses 2c/4Gi), which gives batch-cpu 25000 and batch-memory 146 GiB under the defaults.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from schemas import koordinator, kube, topology, vocab
from schemas.cluster import ConfigMapObserved, NodeObserved, NodeTopologyObserved, PodObserved
from schemas.node import (
    HostApplicationMetric,
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricInfo,
    NodeMetricStatus,
    PodMetric,
    ResourceMap,
)
from schemas.nodemetric_json import snapshot_from_computed
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from services.noderesource import config as colocation
from services.noderesource import core, numa
from services.noderesource import state as state_module
from services.noderesource.state import (
    PROBLEM_CONFIG_ERROR,
    PROBLEM_MISSING_OBJECT,
    PROBLEM_OTHER_CONFIGMAP,
    PROBLEM_STALE_NODEMETRIC,
    PROBLEM_STALE_VERSION,
    ClusterState,
    LastWrite,
    StateEvent,
    decision_identity,
    decision_time,
    event_time,
    is_repeat,
    last_write_after,
    trigger_of,
)
from services.noderesource.strategy import ColocationStrategy

T0 = 1_767_268_800.0  # 2026-01-01T12:00:00Z
GI = 1024**3
BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY = core.ALL_RESOURCES
NODE = "node-a"


def node_event(
    name: str = NODE,
    *,
    rv: str = "1",
    labels: dict[str, str] | None = None,
    deleted: bool = False,
    cpu: str = "100",
) -> NodeObserved:
    node = msgspec.convert(
        {
            "metadata": {"name": name, "labels": labels or {}},
            "status": {"capacity": {"cpu": cpu, "memory": "400Gi"}, "allocatable": {"cpu": "98", "memory": "392Gi"}},
        },
        kube.Node,
    )
    return NodeObserved(name=name, observed_at=T0, resource_version=rv, deleted=deleted, node=None if deleted else node)


def pod_event(
    name: str,
    cpu: str,
    memory: str,
    *,
    node: str = NODE,
    rv: str = "1",
    deleted: bool = False,
    priority: str = "koord-prod",
    at: float = T0,
) -> PodObserved:
    pod = msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "default", "labels": {vocab.PRIORITY_CLASS_LABEL: priority}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
            },
            "status": {"phase": "Running", "qosClass": "Burstable"},
        },
        kube.Pod,
    )
    return PodObserved(
        namespace="default",
        name=name,
        observed_at=at,
        node_name=node,
        resource_version=rv,
        deleted=deleted,
        pod=None if deleted else pod,
    )


def usage(cores: float, gib: int) -> ResourceMap:
    return ResourceMap(resources={"cpu": int(cores * 1000), "memory": gib * GI})


def metric_event(node: str = NODE, *, at: float = T0, system_cores: float = 3) -> NodeMetricComputed:
    return NodeMetricComputed(
        node=node,
        report_time=at,
        spec=MetricCollectPolicy(),
        status=NodeMetricStatus(
            update_time=at,
            node_metric=NodeMetricInfo(
                node_usage=usage(15, 74),
                aggregated_node_usages=[],
                system_usage=usage(system_cores, 10),
                aggregated_system_usages=[],
            ),
            pods_metric=[
                PodMetric(namespace="default", name="a", pod_usage=usage(10, 60), priority="koord-prod", qos="LS"),
                PodMetric(namespace="default", name="c", pod_usage=usage(2, 4), priority="koord-prod", qos="LS"),
            ],
        ),
    )


def config_event(config: dict[str, Any] | None = None, *, rv: str = "1", deleted: bool = False) -> ConfigMapObserved:
    text = json.dumps({"enable": True} if config is None else config)
    return ConfigMapObserved(
        namespace=colocation.CONFIGMAP_NAMESPACE,
        name=colocation.CONFIGMAP_NAME,
        observed_at=T0,
        resource_version=rv,
        deleted=deleted,
        data={} if deleted else {colocation.COLOCATION_CONFIG_KEY: text},
    )


def worked_example() -> ClusterState:
    state = ClusterState()
    for event in (
        config_event(),
        node_event(),
        pod_event("a", "40", "100Gi"),
        pod_event("b", "20", "40Gi"),
        pod_event("batch", "10", "10Gi", priority="koord-batch"),
        metric_event(),
    ):
        state.apply(event)
    return state


def decide(state: ClusterState, *, now: float = T0, last: LastWrite | None = None) -> NodeResourceComputed:
    decision = state.decide(NODE, now=now, last_written=last)
    assert decision is not None
    return decision


# --- the decision


def test_the_worked_example_gives_the_documented_batch_values() -> None:
    decision = decide(worked_example())
    assert decision.outcome == "computed"
    assert decision.resources[BATCH_CPU] == 25_000
    assert decision.resources[BATCH_MEMORY] == 146 * GI
    assert decision.explanation[BATCH_CPU].message.startswith("kubernetes.io/batch-cpu 25000 = capacity 100000")
    assert decision.pods.high_priority == 2 and decision.pods.low_priority_skipped == 1
    assert decision.pods.dangling_metrics_counted == 1
    assert decision.write_due and decision.write_reason == "no status update recorded for this node"
    assert decision.trigger == ("resync",)
    origin = json.loads(decision.annotations[koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE])
    assert origin == {"resources": {BATCH_CPU: "25k", BATCH_MEMORY: "146Gi"}}


def test_the_decision_round_trips_as_json_and_is_validated() -> None:
    decision = decide(worked_example())
    assert NODERESOURCE_COMPUTED_DECODER.decode(msgspec.json.encode(decision)) == decision
    raw = msgspec.to_builtins(decision)
    raw["resources"]["kubernetes.io/gpu"] = 1
    with pytest.raises(msgspec.ValidationError, match="unknown resource names"):
        NODERESOURCE_COMPUTED_DECODER.decode(msgspec.json.encode(raw))
    raw = msgspec.to_builtins(decision)
    raw["trigger"] = ["weather"]
    with pytest.raises(msgspec.ValidationError):
        NODERESOURCE_COMPUTED_DECODER.decode(msgspec.json.encode(raw))


def test_triggers_are_sorted_and_deduplicated() -> None:
    decision = worked_example().decide(NODE, now=T0, last_written=None, trigger=["pods", "node", "pods"])
    assert decision is not None and decision.trigger == ("node", "pods")


def test_a_stale_nodemetric_degrades_the_node_after_degrade_time_minutes() -> None:
    state = worked_example()
    fresh = decide(state, now=T0 + 15 * 60)
    assert fresh.outcome == "computed"
    stale = decide(state, now=T0 + 15 * 60 + 1, last=last_write_after(fresh))
    assert stale.outcome == "degraded" and stale.reason == core.REASON_BATCH_DEGRADED
    assert set(stale.resources.values()) == {None}
    assert stale.write_due and "batch-cpu differs" in stale.write_reason


def test_a_node_without_nodemetric_is_degraded() -> None:
    state = worked_example()
    state.snapshots.clear()
    assert decide(state).outcome == "degraded"


def test_colocation_disabled_removes_every_resource() -> None:
    state = worked_example()
    assert state.apply(config_event({"enable": False}, rv="2")) == {NODE}
    decision = decide(state)
    assert decision.outcome == "disabled" and decision.reason == core.REASON_DISABLED
    assert decision.resources == dict.fromkeys(core.ALL_RESOURCES)


def test_a_node_config_entry_is_named_in_the_decision() -> None:
    state = worked_example()
    config = {"enable": True, "nodeConfigs": [{"name": "big", "nodeSelector": {"matchLabels": {"pool": "big"}}}]}
    state.apply(config_event(config, rv="2"))
    state.apply(node_event(rv="2", labels={"pool": "big"}))
    assert decide(state).node_config == "big"


# --- hysteresis


def test_a_change_under_the_diff_threshold_is_not_a_due_write() -> None:
    state = worked_example()
    first = decide(state)
    baseline = last_write_after(first)
    assert baseline == LastWrite(at=T0, resources=first.written_amounts)
    state.apply(metric_event(at=T0 + 60, system_cores=5))  # system 3 → 5 cores: batch-cpu 25000 → 23000 (8 %)
    second = decide(state, now=T0 + 60, last=baseline)
    assert second.resources[BATCH_CPU] == 23_000
    assert not second.write_due and second.write_reason == "up to date"
    assert second.last_write_at == T0 and second.last_write_resources == first.written_amounts
    assert last_write_after(second) == baseline  # the baseline stays the last due write
    assert not is_repeat(first, second)  # the resources moved: published, with write_due False


def test_a_change_over_the_diff_threshold_is_a_due_write() -> None:
    state = worked_example()
    baseline = last_write_after(decide(state))
    state.apply(metric_event(at=T0 + 60, system_cores=6))  # 25000 → 22000: 12 %
    second = decide(state, now=T0 + 60, last=baseline)
    assert second.write_due
    assert second.write_reason == "kubernetes.io/batch-cpu differs by more than resourceDiffThreshold 0.1"
    assert last_write_after(second) == LastWrite(at=T0 + 60, resources=second.written_amounts)


def test_the_write_is_due_again_after_update_time_threshold_seconds() -> None:
    state = worked_example()
    first = decide(state)
    baseline = last_write_after(first)
    assert not decide(state, now=T0 + 300, last=baseline).write_due
    late = decide(state, now=T0 + 301, last=baseline)
    assert late.write_due and "updateTimeThresholdSeconds 300" in late.write_reason
    assert not is_repeat(first, late)


def test_the_same_decision_for_other_reasons_has_one_identity() -> None:
    """Two replicas briefly owning a node decide it at the same time to the same effect, one from a NodeMetric and
    one replaying the node, its pods and that NodeMetric (a combined failover run stored both, the second a repeat):
    one identity, so one msg id and one message. Any decided field apart is another decision."""
    state = worked_example()
    first = decide(state)
    replayed = msgspec.structs.replace(first, trigger=("node", "nodemetric", "pods"), explanation={})
    assert decision_identity(replayed) == decision_identity(first)
    assert msgspec.json.encode(replayed) != msgspec.json.encode(first)
    moved = dict(first.resources) | {BATCH_CPU: 1}
    for other in (
        msgspec.structs.replace(first, resources=moved),
        msgspec.structs.replace(first, computed_at=first.computed_at + 1),
        msgspec.structs.replace(first, write_due=not first.write_due),
        msgspec.structs.replace(first, annotations={"a": "b"}),
    ):
        assert decision_identity(other) != decision_identity(first)


def test_an_unchanged_decision_without_a_due_write_is_a_repeat() -> None:
    state = worked_example()
    first = decide(state)
    again = decide(state, now=T0 + 10, last=last_write_after(first))
    assert is_repeat(first, again)
    assert not is_repeat(None, again)
    assert not is_repeat(first, first)  # a due write is never a repeat


def test_decision_times_never_go_back() -> None:
    previous = decide(worked_example(), now=T0 + 100)
    assert decision_time(T0, previous) == T0 + 100
    assert decision_time(T0 + 200, previous) == T0 + 200
    assert decision_time(T0, None) == T0


# --- which nodes an event touches


def test_each_event_kind_touches_its_nodes() -> None:
    state = ClusterState()
    assert state.apply(node_event("n1")) == {"n1"}
    assert state.apply(node_event("n2")) == {"n2"}
    assert state.apply(pod_event("a", "1", "1Gi", node="n1")) == {"n1"}
    assert state.apply(metric_event("n2")) == {"n2"}
    assert state.apply(config_event()) == {"n1", "n2"}
    assert state.apply(config_event(rv="2")) == set()  # same effective config: nothing to recompute
    assert trigger_of(node_event()) == "node" and trigger_of(metric_event()) == "nodemetric"
    assert event_time(metric_event(at=T0 + 5)) == T0 + 5 and event_time(pod_event("a", "1", "1", at=T0 + 7)) == T0 + 7


def test_a_pod_moving_nodes_touches_both_and_moves_in_the_index() -> None:
    state = ClusterState()
    state.apply(pod_event("a", "1", "1Gi", node="n1"))
    assert state.apply(pod_event("a", "1", "1Gi", node="n2", rv="2")) == {"n1", "n2"}
    assert state.pods_by_node == {"n2": {"default/a"}}
    assert state.pod_node == {"default/a": "n2"}


def test_a_pod_tombstone_removes_the_pod() -> None:
    state = worked_example()
    assert state.apply(pod_event("a", "40", "100Gi", rv="2", deleted=True)) == {NODE}
    assert "default/a" not in state.pods and state.pods_by_node[NODE] == {"default/b", "default/batch"}
    assert decide(state).pods.dangling_metrics_counted == 2  # a's metric is now dangling


def test_a_changed_pod_request_is_used() -> None:
    state = worked_example()
    assert decide(state).resources[BATCH_CPU] == 25_000
    state.apply(pod_event("b", "30", "40Gi", rv="2"))  # b has no metric: its request counts as used
    assert decide(state).resources[BATCH_CPU] == 15_000


def test_an_unscheduled_pod_is_kept_without_a_node() -> None:
    state = ClusterState()
    assert state.apply(pod_event("a", "1", "1Gi", node="")) == set()
    assert "default/a" in state.pods and state.pods_by_node == {}
    assert state.apply(pod_event("a", "1", "1Gi", node="n1", rv="2")) == {"n1"}


def test_pods_of_a_node_not_seen_yet_are_kept_and_nothing_is_decided_for_it() -> None:
    state = ClusterState()
    state.apply(config_event())
    assert state.apply(pod_event("a", "40", "100Gi")) == {NODE}
    assert state.apply(metric_event()) == {NODE}
    assert state.decide(NODE, now=T0, last_written=None) is None
    state.apply(pod_event("b", "20", "40Gi"))
    assert state.apply(node_event()) == {NODE}
    assert decide(state).resources[BATCH_CPU] == 25_000


def test_a_node_tombstone_leaves_nothing_to_decide() -> None:
    state = worked_example()
    assert state.apply(node_event(rv="2", deleted=True)) == {NODE}
    assert state.decide(NODE, now=T0, last_written=None) is None
    assert state.pods_by_node[NODE]  # the pods go with their own tombstones


def test_older_resource_versions_are_ignored() -> None:
    state = ClusterState()
    state.apply(node_event(rv="10", cpu="100"))
    assert state.apply(node_event(rv="9", cpu="50")) == set()
    assert state.problems == [PROBLEM_STALE_VERSION]
    assert state.nodes[NODE].status.capacity == {"cpu": "100", "memory": "400Gi"}
    assert state.apply(node_event(rv="10", cpu="100")) == set()  # a redelivery: nothing new, not a problem
    assert state.problems == [PROBLEM_STALE_VERSION]
    assert state.apply(node_event(rv="11", cpu="50")) == {NODE}


def test_versions_compare_as_integers() -> None:
    state = ClusterState()
    state.apply(pod_event("a", "1", "1Gi", rv="9"))
    assert state.apply(pod_event("a", "2", "1Gi", rv="10")) == {NODE}  # "10" < "9" as strings


def test_versions_that_do_not_parse_are_applied_in_arrival_order() -> None:
    state = ClusterState()
    state.apply(node_event(rv="abc", cpu="100"))
    assert state.apply(node_event(rv="", cpu="50")) == {NODE}
    assert state.problems == []


def test_an_older_event_after_a_tombstone_does_not_resurrect() -> None:
    state = ClusterState()
    state.apply(pod_event("a", "1", "1Gi", rv="5"))
    state.apply(pod_event("a", "1", "1Gi", rv="6", deleted=True))
    assert state.apply(pod_event("a", "1", "1Gi", rv="5")) == set()
    assert "default/a" not in state.pods and state.problems == [PROBLEM_STALE_VERSION]


def test_pod_tombstones_are_held_for_the_most_recent_deletions_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every finished pod leaves a tombstone version; holding them all grew `koordbus up --simulate-nodes`'s
    noderesource state by every pod the simulated cluster ever deleted."""
    monkeypatch.setattr(state_module, "POD_TOMBSTONES_KEPT", 3, raising=False)
    state = ClusterState()
    state.apply(node_event())
    for i in range(10):
        state.apply(pod_event(f"p{i}", "1", "1Gi", rv="5"))
        state.apply(pod_event(f"p{i}", "1", "1Gi", rv="6", deleted=True))
    assert len(state._versions) == 1 + 3  # the node's, and the three newest tombstones
    assert state.apply(pod_event("p9", "1", "1Gi", rv="5")) == set()  # a recent deletion still stops a stale event
    assert "default/p9" not in state.pods and state.problems == [PROBLEM_STALE_VERSION]


def test_a_pod_created_again_under_a_deleted_name_keeps_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "POD_TOMBSTONES_KEPT", 1)
    state = ClusterState()
    state.apply(pod_event("a", "1", "1Gi", rv="5"))
    state.apply(pod_event("a", "1", "1Gi", rv="6", deleted=True))
    state.apply(pod_event("a", "2", "1Gi", rv="7"))  # the name in use again (a StatefulSet's pod)
    state.apply(pod_event("b", "1", "1Gi", rv="8"))
    state.apply(pod_event("b", "1", "1Gi", rv="9", deleted=True))
    state.apply(pod_event("c", "1", "1Gi", rv="10"))
    state.apply(pod_event("c", "1", "1Gi", rv="11", deleted=True))  # b's tombstone goes; a is no tombstone
    assert state.apply(pod_event("a", "1", "1Gi", rv="6")) == set()
    assert state.pods["default/a"].request["cpu"] == 2000


def test_an_event_without_its_object_is_skipped() -> None:
    state = ClusterState()
    assert state.apply(NodeObserved(name=NODE, observed_at=T0)) == set()
    assert state.apply(PodObserved(namespace="d", name="p", observed_at=T0)) == set()
    assert state.problems == [PROBLEM_MISSING_OBJECT, PROBLEM_MISSING_OBJECT]


def test_an_older_nodemetric_is_ignored() -> None:
    state = ClusterState()
    state.apply(metric_event(at=T0 + 60))
    assert state.apply(metric_event(at=T0)) == set()
    assert state.apply(metric_event(at=T0 + 60)) == set()
    assert state.problems == [PROBLEM_STALE_NODEMETRIC]
    assert state.snapshots[NODE].update_time == T0 + 60


# --- the colocation config


def test_nothing_is_decided_before_the_config_is_available() -> None:
    state = ClusterState()
    state.apply(node_event())
    state.apply(metric_event())
    assert state.decide(NODE, now=T0, last_written=None) is None
    assert state.apply(config_event()) == {NODE}
    assert decide(state).outcome == "computed"


def test_a_missing_configmap_at_start_means_the_defaults() -> None:
    state = ClusterState()
    state.apply(node_event())
    assert state.assume_configmap_absent() == {NODE}
    assert decide(state).outcome == "disabled"
    assert state.assume_configmap_absent() == set()


def test_assume_configmap_absent_does_nothing_once_one_was_seen() -> None:
    state = worked_example()
    assert state.assume_configmap_absent() == set()
    assert decide(state).outcome == "computed"


def test_a_configmap_tombstone_reverts_to_the_defaults() -> None:
    state = worked_example()
    assert state.apply(config_event(rv="2", deleted=True)) == {NODE}
    assert decide(state).outcome == "disabled"


def test_a_bad_config_keeps_the_previous_one_and_says_so() -> None:
    state = worked_example()
    assert state.apply(config_event({"enable": True, "midCPUThresholdPercent": 150}, rv="2")) == set()
    assert state.problems == [PROBLEM_CONFIG_ERROR]
    decision = decide(state)
    assert decision.outcome == "computed"
    assert any("midCPUThresholdPercent" in warning for warning in decision.warnings)


def test_other_configmaps_are_ignored() -> None:
    state = worked_example()
    other = ConfigMapObserved(namespace="default", name="x", observed_at=T0, data={})
    assert state.apply(other) == set()
    assert state.problems == [PROBLEM_OTHER_CONFIGMAP]


def test_a_config_change_touches_every_node() -> None:
    state = worked_example()
    state.apply(node_event("node-b"))
    assert state.apply(config_event({"enable": True, "cpuReclaimThresholdPercent": 70}, rv="2")) == {NODE, "node-b"}
    assert decide(state).resources[BATCH_CPU] == 35_000  # margin 30 instead of 40 cores


# --- NodeMetricComputed as a snapshot


def test_snapshot_from_computed() -> None:
    snapshot = snapshot_from_computed(metric_event(at=T0 + 1))
    assert snapshot.update_time == T0 + 1
    assert snapshot.node_usage == {"cpu": 15_000, "memory": 74 * GI}
    assert snapshot.system_usage == {"cpu": 3_000, "memory": 10 * GI}
    assert [(p.key, p.usage, p.priority, p.qos) for p in snapshot.pods] == [
        ("default/a", {"cpu": 10_000, "memory": 60 * GI}, "koord-prod", "LS"),
        ("default/c", {"cpu": 2_000, "memory": 4 * GI}, "koord-prod", "LS"),
    ]
    assert snapshot.host_applications == () and snapshot.prod_reclaimable is None


def test_snapshot_from_computed_carries_host_applications_for_the_batch_calculation() -> None:
    event = metric_event()
    apps = [
        HostApplicationMetric(name="nginx", usage=usage(2, 3), priority="koord-prod", qos="LS"),
        HostApplicationMetric(name="backup", usage=usage(1, 1), priority="koord-batch", qos="BE"),
        HostApplicationMetric(name="empty", usage=ResourceMap()),
    ]
    snapshot = snapshot_from_computed(
        msgspec.structs.replace(event, status=msgspec.structs.replace(event.status, host_applications=apps))
    )
    assert [(a.name, a.usage, a.priority, a.qos) for a in snapshot.host_applications] == [
        ("nginx", {"cpu": 2_000, "memory": 3 * GI}, "koord-prod", "LS"),
        ("backup", {"cpu": 1_000, "memory": GI}, "koord-batch", "BE"),
        ("empty", {}, "", ""),
    ]
    # spec §2.4: host applications above koord-batch (prod and mid) count as system usage; batch ones do not
    assert core.host_apps_used_above(snapshot, vocab.PRIORITY_BATCH) == {"cpu": 2_000, "memory": 3 * GI}


def test_snapshot_from_computed_keeps_no_data_apart_from_zero() -> None:
    event = metric_event()
    empty = msgspec.structs.replace(
        event.status.node_metric, node_usage=ResourceMap(), system_usage=ResourceMap(resources={"gpu": 1})
    )
    snapshot = snapshot_from_computed(
        msgspec.structs.replace(event, status=msgspec.structs.replace(event.status, node_metric=empty))
    )
    assert snapshot.node_usage is None and snapshot.system_usage == {}


# --- NUMA zones (§2.7)


def topology_event(
    zones: list[tuple[str, str, str]] | None, *, rv: str = "1", deleted: bool = False
) -> NodeTopologyObserved:
    entries = [
        topology.Zone(
            name=name,
            type="Node",
            resources=[
                topology.ResourceInfo(name="cpu", capacity=cpu, allocatable=cpu, available=cpu),
                topology.ResourceInfo(name="memory", capacity=memory, allocatable=memory, available=memory),
            ],
        )
        for name, cpu, memory in zones or []
    ]
    return NodeTopologyObserved(name=NODE, observed_at=T0, resource_version=rv, deleted=deleted, zones=entries)


def test_a_topology_adds_the_numa_calculation_to_the_decision() -> None:
    state = worked_example()
    assert decide(state).zones == {}
    assert state.apply(topology_event([("node-0", "50", "200Gi"), ("node-1", "50", "200Gi")])) == {NODE}
    decision = decide(state)
    pods = [state.pods[key] for key in sorted(state.pods_by_node[NODE])]
    expected = numa.calculate(
        state.nodes[NODE], pods, state.snapshots[NODE], ColocationStrategy(enable=True), state.zones[NODE]
    )
    assert expected is not None and decision.zones == expected.values()
    assert set(decision.zones) == {"node-0", "node-1"} and all(v[vocab.BATCH_CPU] for v in decision.zones.values())
    explained = decision.zone_explanation["node-0"][vocab.BATCH_CPU]
    assert str(decision.zones["node-0"][vocab.BATCH_CPU]) in explained.message
    previous = decision
    assert not is_repeat(previous, msgspec.structs.replace(decision, zones={"node-0": {vocab.BATCH_CPU: 1}}))


def test_zones_go_with_a_deleted_topology_an_older_version_or_a_degraded_node() -> None:
    state = worked_example()
    state.apply(topology_event([("node-0", "50", "200Gi"), ("node-1", "50", "200Gi")], rv="5"))
    assert state.apply(topology_event([("node-0", "10", "10Gi")], rv="4")) == set()  # older: ignored
    assert len(state.zones[NODE]) == 2
    assert decide(state, now=T0 + 16 * 60).zones == {}  # degraded: batch did not run, neither do zones
    state.apply(topology_event(None, rv="6", deleted=True))
    assert NODE not in state.zones and decide(state).zones == {}


def test_a_replica_takes_in_only_what_concerns_its_nodes() -> None:
    owns = {"node-a"}.__contains__
    state = ClusterState()
    mine = [config_event(), node_event("node-a"), pod_event("a1", "1", "1Gi", node="node-a"), metric_event("node-a")]
    others = [node_event("node-b"), pod_event("b1", "1", "1Gi", node="node-b"), metric_event("node-b")]
    unscheduled = pod_event("u1", "1", "1Gi", node="")
    assert all(state.concerns(e, owns) for e in mine)
    assert not any(state.concerns(e, owns) for e in [*others, unscheduled])
    for event in mine:
        state.apply(event)
    # a pod it holds concerns it whatever the event says (its deletion names no node)
    gone = msgspec.structs.replace(pod_event("a1", "1", "1Gi", node="", rv="2", deleted=True), node_name="")
    assert state.concerns(gone, owns)
    assert state.apply(gone) == {"node-a"} and not state.pods


def test_retain_forgets_the_nodes_lost_so_that_a_replay_takes_them_in_again() -> None:
    def of(node: str) -> list[StateEvent]:
        return [node_event(node), pod_event(f"{node}-pod", "1", "1Gi", node=node), metric_event(node)]

    state = ClusterState()
    for event in [config_event(), *of("node-a"), *of("node-b"), pod_event("u1", "1", "1Gi", node="")]:
        state.apply(event)
    state.zones["node-b"] = state.zones["node-a"] = ()
    state.retain({"node-a"}.__contains__)
    assert set(state.nodes) == {"node-a"} and set(state.snapshots) == {"node-a"} and set(state.zones) == {"node-a"}
    assert set(state.pods) == {"default/node-a-pod"} and set(state.pods_by_node) == {"node-a"}
    assert state.config.available  # the ConfigMap stays
    # the node gained back: its replayed events are taken in again (the versions held for it were forgotten) …
    assert [state.apply(e) for e in of("node-b")] == [{"node-b"}] * 3
    assert set(state.pods_by_node["node-b"]) == {"default/node-b-pod"}
    # … while a replay of what it kept changes nothing
    assert [state.apply(e) for e in of("node-a")] == [set()] * 3
