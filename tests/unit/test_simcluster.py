"""The simulated cluster's pure plans (koordbus.simcluster) and the pods a simulated node gains and loses."""

from __future__ import annotations

import datetime as dt

import msgspec

from agent.actuate import NodePod
from agent.simulate import SimulatedNode
from agent.simulate_pods import UsageProfile
from koordbus.simcluster import descheduling, placement, pods, teams
from schemas import kube, quota
from schemas import quota_events as ev
from services.quota.core import QuotaTreeState, Rejected, decide

T0 = 1_795_776_000.0


def _cores(value: str) -> float:
    return float(value)


def test_the_teams_tree_is_valid_and_some_teams_want_more_than_their_min() -> None:
    items = teams.quotas(20)
    assert [q["metadata"]["name"] for q in items] == [
        "engineering",
        "team-search",
        "team-ml",
        "team-web",
        "team-billing",
    ]
    assert all(msgspec.convert(q, quota.ElasticQuota).metadata.name for q in items)  # the API's import validates
    demand: dict[str, float] = {}
    for pod in teams.wanted(20, now=T0):
        demand[pod.team] = demand.get(pod.team, 0) + _cores(
            pod.pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
        )
    mins = {q["metadata"]["name"]: _cores(q["spec"]["min"]["cpu"]) for q in items}
    assert demand["team-search"] > mins["team-search"] and demand["team-ml"] > mins["team-ml"]  # they borrow
    assert demand["team-web"] < mins["team-web"]  # and does not lend what it leaves unused
    web = next(q for q in items if q["metadata"]["name"] == "team-web")
    assert web["metadata"]["labels"][quota.LABEL_ALLOW_LENT_RESOURCE] == "false"
    billing = [p for p in teams.wanted(20, now=T0) if p.team == "team-billing"]
    assert billing and all(p.pod["metadata"]["labels"][quota.LABEL_PREEMPTIBLE] == "false" for p in billing)


def test_the_teams_tree_imports_at_any_node_count() -> None:
    """The quota service accepts the tree `koordbus up --simulate-nodes N` imports for every N, a handful of nodes
    included, where each team's share rounds up to its one core (its min-sum and min-le-max rules refused it at 1, 2
    and 5 nodes when the parent's min was rounded from the unrounded sum)."""
    for nodes in (*range(1, 101), 250, 333, 500, 1000, 5000):
        batch = tuple(msgspec.convert(q, quota.ElasticQuota) for q in teams.quotas(nodes))
        command = ev.ImportQuotas(command_id=f"import-{nodes}", quotas=batch)
        try:
            events = decide(
                QuotaTreeState(), command, now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), actor="t", pods_by_quota={}
            )
        except Rejected as rejected:
            raise AssertionError(f"{nodes} nodes: {[v.message for v in rejected.violations]}") from None
        assert sum(len(e.quotas) for e in events if isinstance(e, ev.QuotasImported)) == len(batch), nodes


def test_team_pods_start_and_finish_over_time_and_are_the_same_after_a_restart() -> None:
    now = teams.wanted(20, now=T0)
    later = teams.wanted(20, now=T0 + 600)
    assert {p.key for p in now}.isdisjoint({p.key for p in later})  # every pod runs about five minutes
    assert [p.pod for p in teams.wanted(20, now=T0)] == [p.pod for p in now]
    assert all(p.start <= T0 < p.end for p in now)
    expected = sum(team.replicas_per_node * 20 for team in teams.TEAMS)
    assert 0.6 * expected <= len(now) <= 1.4 * expected


def _pod(cpu: str, memory: str = "1Gi", node: str = "") -> kube.Pod:
    return msgspec.convert(
        {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
            },
        },
        kube.Pod,
    )


def test_placement_keeps_the_nodes_a_pod_fits_on_and_picks_the_best_score() -> None:
    allocatable = {"a": {"cpu": 4000, "memory": 8 * 2**30}, "b": {"cpu": 4000, "memory": 8 * 2**30}}
    room = placement.free(allocatable, [("a", placement.request(_pod("3500m"))), ("gone", {"cpu": 1})])
    assert room == {"a": {"cpu": 500, "memory": 7 * 2**30}, "b": allocatable["b"]}
    assert placement.candidates(placement.request(_pod("1")), room=room) == ["b"]
    assert placement.candidates(placement.request(_pod("500m")), room=room) == ["a", "b"]
    assert placement.candidates(placement.request(_pod("1", memory="9Gi")), room=room) == []
    assert placement.best({"a": 10, "b": 40}, among=["a", "b"]) == "b"
    assert placement.best({"a": 40, "b": 40}, among=["b", "a"]) == "a"
    assert placement.best({}, among=["a"]) is None


def test_a_few_nodes_run_hot_with_peaks_spread_over_the_day() -> None:
    names = [f"n{i:02d}" for i in range(20)]
    loads = descheduling.node_loads(names)
    hot = {name: load for name, load in loads.items() if load.online_share == descheduling.HOT_SHARE}
    assert len(hot) == 3 == descheduling.hot_count(20)
    assert sorted(load.peak_hour for load in hot.values()) == [6.0, 14.0, 22.0]
    assert descheduling.hot_count(50) == 6 and descheduling.hot_count(2) == 0
    assert "lowNodeLoadArgs" in descheduling.MIGRATION_ARGS and "EvictDirectly" in descheduling.MIGRATION_ARGS


def test_a_hot_nodes_services_request_no_more_than_the_node_holds() -> None:
    node = SimulatedNode("sim-node-0001", 7, pods=20, online_share=descheduling.HOT_SHARE)
    requested = sum(placement.request(p.pod)["cpu"] for p in node.pods())
    assert requested <= 0.9 * 32_000 + len(node.pods())  # rounding to whole millicores


def test_a_node_runs_the_pods_scheduled_onto_it_and_stops_the_ones_moved_away() -> None:
    node = SimulatedNode("sim-node-0002", 8, cpu_cores=16, pods=10)
    before = node.batch(T0, T0 + 10)
    online = node.pods()[0]
    extra = NodePod(
        pod=msgspec.convert(
            {
                "metadata": {"name": "team-x", "namespace": "team-x", "uid": "0e1d2c3b-4a59-4687-9a0b-1c2d3e4f5a6b"},
                "spec": {"nodeName": node.name, "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "qosClass": "Burstable"},
            },
            kube.Pod,
        )
    )
    node.add_pod(extra, UsageProfile(cpu=2.0, memory=2**30, amplitude=0.0, peak=0.0))
    profile = node.remove_pod(online.uid)
    assert profile is not None and profile.cpu > 0
    assert node.remove_pod(online.uid) is None
    after = node.batch(T0, T0 + 10)
    uids_before = {p.uid for p in before.pods}
    uids_after = {p.uid for p in after.pods}
    assert online.uid in uids_before and online.uid not in uids_after
    assert extra.uid in uids_after
    assert [p.uid for p in node.pods()][-1] == extra.uid and online.uid not in {p.uid for p in node.pods()}
    assert node.remove_pod(extra.uid) == UsageProfile(cpu=2.0, memory=2**30, amplitude=0.0, peak=0.0)


def test_a_pod_bound_reads_scheduled_and_ready_and_a_replacement_is_a_new_unscheduled_pod() -> None:
    doc = {
        "metadata": {"name": "web-abc12", "namespace": "shop", "uid": "u-1", "ownerReferences": [{"name": "web"}]},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
    placed = pods.bound(doc, "n1", at=T0)
    assert placed["spec"]["nodeName"] == "n1" and placed["status"]["phase"] == "Running"
    scheduled = msgspec.convert(placed, kube.Pod).status.conditions or []
    assert [c.type for c in scheduled] == ["PodScheduled", "Initialized", "Ready"]
    assert all(c.last_transition_time is not None and c.last_transition_time.timestamp() == T0 for c in scheduled)
    again = pods.replacement(placed, "web")
    assert again["metadata"]["name"].startswith("web-") and again["metadata"]["uid"] != "u-1"
    assert "nodeName" not in again["spec"] and again["status"] == {"phase": "Pending", "qosClass": "Burstable"}
    assert again == pods.replacement(placed, "web")  # repeatable
    assert again["metadata"]["ownerReferences"] == [{"name": "web"}]
